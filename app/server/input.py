"""Every Litestar route reads its input through these checks (``app.lib.input_checks``).

- ``CheckedRequest`` (the app's request class) decodes JSON bodies with the nesting
  bound and refuses unstorable text, and refuses unstorable text in form fields, so a
  bad body is a 400 naming the field before any handler or database sees it.
- ``refuse_unstorable_parameters`` (the app's ``before_request`` hook) does the same
  for path and query parameters, before the body is read or a dependency resolved.

The raw ASGI surfaces (``/v1`` chat and embeddings, ``/api/rpc``) read their bodies
themselves and call the same checks.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.datastructures import FormMultiDict
from litestar.types import Empty

from app.lib.input_checks import check_text_fields, decode_json


class CheckedRequest(Request[Any, Any, Any]):
    async def json(self) -> Any:
        if self._json is Empty and self._connection_state.json is Empty:
            body = await self.body()
            self._connection_state.json = decode_json(body) if body else None
        return await super().json()

    async def form(self) -> FormMultiDict:
        form = await super().form()
        fields = [(name, value) for name, value in form.multi_items() if isinstance(value, str)]
        check_text_fields(fields)
        check_text_fields((name, name) for name, _ in fields)
        return form


async def refuse_unstorable_parameters(request: Request[Any, Any, Any]) -> None:
    check_text_fields(
        (name, value) for name, value in request.path_params.items() if isinstance(value, str)
    )
    query = request.query_params.multi_items()
    check_text_fields(query)
    check_text_fields((name, name) for name, _ in query)
