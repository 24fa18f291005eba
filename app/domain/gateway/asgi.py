"""The two relaying endpoints of ``/v1`` as raw ASGI handlers.

``POST /v1/chat/completions`` and ``POST /v1/embeddings`` carry every byte of model
traffic. Litestar still routes them and turns raised errors into the error shape,
but the handlers skip its per-request dependency resolution, signature parsing and
response objects, and stream with one disconnect watcher instead of a task group.
Measured in docs/performance.md; the other ``/v1`` routes are ordinary handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from litestar.exceptions import MethodNotAllowedException
from litestar.types import Receive, Scope, Send

from app.domain.accounts.authenticator import Authenticator
from app.domain.gateway.parsing import Endpoint, parse_request
from app.domain.gateway.services import Caller, GatewayService
from app.lib.asgi_stream import send_event_stream
from app.lib.errors import AuthenticationError, PayloadTooLargeError

ASGIHandler = Callable[[Scope, Receive, Send], Awaitable[None]]
_JSON_HEADERS = [(b"content-type", b"application/json")]


def _authorization(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bytes(value).decode("latin-1")
    return None


class _ClientLeft(Exception):
    """The client disconnected before its request was read: nobody to answer."""


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientLeft
        chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _send_json(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def gateway_asgi_handlers(
    authenticator: Authenticator, gateway: GatewayService, *, max_body_bytes: int
) -> tuple[ASGIHandler, ASGIHandler]:
    async def caller_of(scope: Scope) -> Caller:
        principal = await authenticator.authenticate(_authorization(scope))
        if principal is None:
            raise AuthenticationError("authentication required", code="missing_credentials")
        return Caller.of(principal)

    async def relay(scope: Scope, receive: Receive, send: Send, endpoint: Endpoint) -> None:
        if scope.get("method") != "POST":
            raise MethodNotAllowedException(headers={"Allow": "POST"})
        caller = await caller_of(scope)
        try:
            body = await _read_body(receive, max_body_bytes)
        except _ClientLeft:
            return
        request = parse_request(body, endpoint)
        if request.stream:
            await send_event_stream(send, receive, await gateway.open_stream(caller, request))
            return
        outcome = await gateway.complete(caller, request, endpoint)
        await _send_json(send, outcome.content)

    async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
        await relay(scope, receive, send, "chat")

    async def embeddings(scope: Scope, receive: Receive, send: Send) -> None:
        await relay(scope, receive, send, "embeddings")

    return chat_completions, embeddings
