"""What the three transports share: the caller, raw ASGI answers, the log request id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import structlog
from litestar.types import Message, Receive, Scope, Send

from app.domain.calls.callers import PROJECT_HEADER_KEY, CallerResolver
from app.domain.rpc.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    RpcError,
    encode_error,
    rpc_error_of,
)
from app.domain.video.facade import VideoOwner
from app.lib.errors import AronaError

JSON = (b"content-type", b"application/json")
Headers = Sequence[tuple[bytes, bytes]]
ASGIHandler = Callable[[Scope, Receive, Send], Awaitable[None]]
logger = structlog.get_logger()


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def owner_of(callers: CallerResolver, scope: Scope) -> VideoOwner:
    """The caller as ``/v1`` sees it (an API key, or a user token naming its project
    with ``X-Arona-Project``); raises ``AronaError``."""
    caller = await callers.caller(
        header(scope, b"authorization"), header(scope, PROJECT_HEADER_KEY.encode())
    )
    return VideoOwner.of(caller)


async def admitted_owner(
    callers: CallerResolver, scope: Scope, send: Send, *, method: str, wrong_method: str
) -> VideoOwner | None:
    """The caller of an RPC endpoint over plain HTTP, or ``None`` once the refusal is
    sent: a 405 naming ``method`` (``wrong_method`` says what to do instead), or the
    credentials' error."""
    if scope.get("method") != method:
        error = RpcError(
            INVALID_REQUEST, wrong_method, {"code": "method_not_allowed", "status": 405}
        )
        await send_error(send, 405, error, [(b"allow", method.encode())])
        return None
    try:
        return await owner_of(callers, scope)
    except AronaError as exc:
        await send_json(send, *failure(exc))
        return None


def request_id() -> str | None:
    """The id the request's log lines carry (set by the request middleware)."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None


def failure(exc: AronaError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """A transport-level refusal: its HTTP status, JSON-RPC body and headers."""
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    return exc.status_code, encode_error(rpc_error_of(exc)), headers


async def send_json(
    send: Send, status: int, body: bytes, headers: Headers = (), *, http_type: str = "http"
) -> None:
    """A complete JSON answer (``http_type="websocket.http"`` refuses a handshake)."""
    start: dict[str, object] = {
        "type": f"{http_type}.response.start",
        "status": status,
        "headers": [JSON, (b"content-length", str(len(body)).encode()), *headers],
    }
    await send(start)  # type: ignore[arg-type]
    end = {"type": f"{http_type}.response.body", "body": body, "more_body": False}
    await send(end)  # type: ignore[arg-type]


async def send_error(send: Send, status: int, error: RpcError, headers: Headers = ()) -> None:
    await send_json(send, status, encode_error(error), headers)


def guarded(handler: ASGIHandler) -> ASGIHandler:
    """Answer an unexpected failure (a database outage, say) as a JSON-RPC -32603
    rather than the REST error shape, if the response has not started yet."""

    async def guarded_handler(scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await handler(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            logger.exception("rpc transport failed", error_type=type(exc).__name__)
            rid = request_id()
            message = "internal error" + (f" (request id {rid})" if rid else "")
            error = RpcError(INTERNAL_ERROR, message, {"code": "internal_error", "status": 500})
            await send_error(send, 500, error)

    return guarded_handler
