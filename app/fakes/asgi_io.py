"""Raw ASGI I/O for the fake upstreams: no framework, so a benchmark measures the
gateway, not the fake."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import msgspec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_HEADERS = ((b"content-type", b"application/json"),)


async def run_lifespan(receive: Receive, send: Send, *, on_shutdown: Callable[[], None]) -> None:
    """Answer an ASGI lifespan; ``on_shutdown`` frees whatever the fake holds on purpose
    (hung requests), so the server's shutdown does not wait for them."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    if not raw:
        return None
    with contextlib.suppress(msgspec.DecodeError):
        return msgspec.json.decode(raw)
    return None


async def send_bytes(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, payload: Any) -> None:
    await send_bytes(send, status, msgspec.json.encode(payload), JSON_HEADERS)
