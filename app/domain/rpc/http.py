"""``POST /api/rpc``: JSON-RPC over plain HTTP, as a raw ASGI handler.

Raw ASGI (like ``/v1/chat/completions``) so that every answer, refusals included, is
a JSON-RPC message rather than the REST error shape: credentials are checked first
(401/403 with a JSON-RPC error, ``id: null``), then the body is read up to the app's
limit (413), then dispatched (200, or 204 when only notifications were sent).
"""

from __future__ import annotations

from litestar.types import Receive, Scope, Send

from app.domain.asgi_io import ClientLeftError, read_body
from app.domain.calls.callers import CallerResolver
from app.domain.rpc.methods import RpcContext, http_dispatcher
from app.domain.rpc.protocol import INVALID_REQUEST, RpcError
from app.domain.rpc.transport import (
    ASGIHandler,
    admitted_owner,
    guarded,
    request_id,
    send_error,
    send_json,
)
from app.domain.video.facade import VideoJobs
from app.lib.errors import PayloadTooLargeError


def rpc_http_handler(
    callers: CallerResolver, jobs: VideoJobs, *, max_body_bytes: int
) -> ASGIHandler:
    dispatcher = http_dispatcher(request_id)

    async def rpc_http(scope: Scope, receive: Receive, send: Send) -> None:
        owner = await admitted_owner(
            callers,
            scope,
            send,
            method="POST",
            wrong_method="JSON-RPC over HTTP takes POST (or the WebSocket at /api/rpc/ws)",
        )
        if owner is None:
            return
        try:
            body = await read_body(receive, max_body_bytes)
        except ClientLeftError:
            return
        except PayloadTooLargeError:
            error = RpcError(
                INVALID_REQUEST,
                f"request body is larger than {max_body_bytes} bytes",
                {"code": "request_too_large", "status": 413},
            )
            await send_error(send, 413, error)
            return
        answer = await dispatcher.handle(body, RpcContext(owner=owner, jobs=jobs))
        if answer is None:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send_json(send, 200, answer)

    return guarded(rpc_http)
