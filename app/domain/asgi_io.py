"""Low-level ASGI pieces shared by the raw handlers (``/v1`` relays, JSON-RPC, agent and
RPC WebSockets): reading a bounded body, and refusing a WebSocket handshake with an
HTTP answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import WebSocket
from litestar.types import Receive, WebSocketResponseBodyEvent, WebSocketResponseStartEvent

from app.lib.errors import PayloadTooLargeError

CLOSE_POLICY_VIOLATION = 1008
MAX_CLOSE_REASON_CHARS = 120
"""A close frame's reason must fit 123 bytes."""


class ClientLeftError(Exception):
    """The client disconnected before its request body was read: nobody to answer."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; ``PayloadTooLargeError`` past ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeftError
        chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def refuse_websocket(
    socket: WebSocket[Any, Any, Any],
    status: int,
    body: bytes,
    *,
    reason: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Refuse the handshake with an HTTP answer (JSON ``body``) where the server supports
    it (the ``websocket.http.response`` extension), else with a 1008 close."""
    await socket.receive()  # websocket.connect
    extensions = socket.scope.get("extensions") or {}
    if "websocket.http.response" not in extensions:
        await socket.close(code=CLOSE_POLICY_VIOLATION, reason=reason[:MAX_CLOSE_REASON_CHARS])
        return
    start: WebSocketResponseStartEvent = {
        "type": "websocket.http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    }
    await socket.send(start)
    end: WebSocketResponseBodyEvent = {
        "type": "websocket.http.response.body",
        "body": body,
        "more_body": False,
    }
    await socket.send(end)
