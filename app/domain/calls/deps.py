"""``caller``: who a call is charged to, for handlers outside ``/v1``'s own dependency
(video jobs). One dependency, like ``/v1``'s ``gateway_call``: the caller is resolved
from the ``Authorization`` and ``X-Arona-Project`` headers (``callers.py``)."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.di import Provide

from app.domain.calls.callers import PROJECT_HEADER, Caller, CallerResolver


def calls_dependencies(callers: CallerResolver) -> dict[str, Provide]:
    async def provide_caller(request: Request[Any, Any, Any]) -> Caller:
        headers = request.headers
        return await callers.caller(headers.get("authorization"), headers.get(PROJECT_HEADER))

    return {"caller": Provide(provide_caller)}
