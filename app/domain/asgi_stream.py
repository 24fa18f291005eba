"""Relay an async iterator of SSE bytes to an ASGI client, watching for disconnects.

Shared by the ``/v1`` gateway and the runtime chat. One watcher task per stream
(not a task group): when the client goes away mid-stream the relaying task is
cancelled at once, the cancellation is absorbed here, and the iterator's own
clean-up (close the upstream, meter, pin) runs to completion.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from litestar.types import Receive, Send

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def send_event_stream(
    send: Send,
    receive: Receive,
    events: AsyncGenerator[bytes, None],
    *,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Relay ``events``; a client disconnect cancels the relay at once (the relay's own
    clean-up then closes the upstream and meters the call as abandoned)."""
    relay = asyncio.current_task()
    left = False
    finished = False

    def on_disconnect(watch: asyncio.Future[None]) -> None:
        nonlocal left
        # After the last byte, receive() reports a disconnect too: that is no reason
        # to cancel the clean-up that follows.
        if finished or watch.cancelled() or relay is None:
            return
        left = True
        relay.cancel()

    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    watcher.add_done_callback(on_disconnect)
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*SSE_HEADERS, *extra_headers],
            }
        )
        async for chunk in events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finished = True  # everything relayed: a disconnect from here on changes nothing
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not left or relay is None:
            raise  # a shutdown, not the client: let it through
        relay.uncancel()
    finally:
        finished = True
        watcher.cancel()
        await events.aclose()
