"""The two relaying endpoints of ``/v1`` as raw ASGI handlers.

``POST /v1/chat/completions`` and ``POST /v1/embeddings`` carry every byte of model
traffic. Litestar still routes them and turns raised errors into the error shape,
but the handlers skip its per-request dependency resolution, signature parsing and
response objects, and stream with one disconnect watcher instead of a task group.
Measured in docs/performance.md; the other ``/v1`` routes are ordinary handlers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable

import msgspec
from litestar.exceptions import MethodNotAllowedException
from litestar.types import Receive, Scope, Send

from app.domain.asgi_io import ClientLeftError, read_body
from app.domain.asgi_stream import send_event_stream
from app.domain.calls.callers import PROJECT_HEADER_KEY, Caller, CallerResolver
from app.domain.gateway.parsing import Endpoint, parse_request
from app.domain.gateway.services import GatewayService
from app.lib.errors import AronaError

ASGIHandler = Callable[[Scope, Receive, Send], Awaitable[None]]
_JSON_HEADERS = [(b"content-type", b"application/json")]


_PROJECT = PROJECT_HEADER_KEY.encode()


def _credentials(scope: Scope) -> tuple[str | None, str | None]:
    """The ``Authorization`` and ``X-Arona-Project`` headers."""
    authorization = project = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = bytes(value).decode("latin-1")
        elif name == _PROJECT:
            project = bytes(value).decode("latin-1")
    return authorization, project


async def _send_json(
    send: Send, body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> None:
    raw_headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if headers:
        raw_headers += [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(send: Send, error: AronaError) -> None:
    """The error shape, answered here rather than raised into Litestar: its exception
    path (a response object, its headers and render) cost a failed call a third more
    than a success's whole answer (docs/performance.md, upstream 500/429 path)."""
    await _send_json(send, msgspec.json.encode(error.body()), error.status_code, error.headers)


def gateway_asgi_handlers(
    callers: CallerResolver, gateway: GatewayService, *, max_body_bytes: int
) -> tuple[ASGIHandler, ASGIHandler]:
    async def caller_of(scope: Scope) -> Caller:
        return await callers.caller(*_credentials(scope))

    async def relay(scope: Scope, receive: Receive, send: Send, endpoint: Endpoint) -> None:
        if scope.get("method") != "POST":
            raise MethodNotAllowedException(headers={"Allow": "POST"})
        stream: AsyncGenerator[bytes, None] | None = None
        try:
            caller = await caller_of(scope)
            body = await read_body(receive, max_body_bytes)
            request = parse_request(body, endpoint)
            if request.stream:
                stream = await gateway.open_stream(caller, request)
            else:
                content = (await gateway.complete(caller, request, endpoint)).content
        except ClientLeftError:
            return
        except AronaError as error:  # nothing was sent yet
            await _send_error(send, error)
            return
        if stream is not None:
            await send_event_stream(send, receive, stream)
        else:
            await _send_json(send, content)

    async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await relay(scope, receive, send, "chat")

    async def embeddings(scope: Scope, receive: Receive, send: Send) -> None:
        await relay(scope, receive, send, "embeddings")

    return chat_completions, embeddings
