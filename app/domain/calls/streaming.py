"""The end of every relayed chat stream, the same on every surface.

``metered_stream`` relays a routed stream to the client and settles the call exactly
once: the relay closed, the call metered, before the stream's last frames go out (a
client that saw ``[DONE]`` was metered), or from ``finally`` when the client left
(a 499 ``client_closed``). An upstream failure after the headers went out travels in
the stream itself: an error frame, then ``[DONE]``.

What differs between surfaces (how chunks are re-framed, what a completed stream
stores, what a dropped one triggers) is a ``StreamSteps``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from app.domain.calls.metering import CallRecord, Meter
from app.lib.errors import AronaError
from app.lib.sse import DONE, error_frame
from app.routing.relay import RelayedStream
from app.routing.types import Usage


class StreamSteps:
    """A surface's part in ``metered_stream``; the defaults relay bytes unchanged."""

    def feed(self, chunk: bytes) -> bytes:
        """What to send for an upstream chunk (empty: nothing yet)."""
        return chunk

    def usage(self, relay: RelayedStream) -> Usage:
        """What the stream counted, for its usage record."""
        return relay.usage

    async def failed(self, error: AronaError) -> dict[str, Any]:
        """The upstream failed mid-stream: the error body to send."""
        return error.body()

    async def completed(self) -> bytes:
        """The upstream finished: the frames that end the stream (sent once metered)."""
        return b""

    async def client_gone(self) -> None:
        """The client left before the stream finished (the relay is closed)."""


async def metered_stream(
    relay: RelayedStream, record: CallRecord, meter: Meter, steps: StreamSteps
) -> AsyncGenerator[bytes, None]:
    finished = False
    settled = False

    async def settle() -> None:
        nonlocal settled
        if settled:
            return
        settled = True
        if not finished:
            record.client_closed()
        try:
            await relay.aclose()
            if not finished:
                await steps.client_gone()
        finally:
            # Latency failover hears of the first token from the routing service (every
            # surface's calls count), not from here.
            record.relayed(relay, steps.usage(relay))
            await meter.record(record)

    try:
        try:
            async for chunk in relay:
                out = steps.feed(chunk)
                if out:
                    yield out
        except AronaError as exc:
            # Headers are gone already: the failure travels in the stream itself.
            record.failed(exc)
            body = await steps.failed(exc)
            finished = True
            await settle()
            yield error_frame(body) + DONE
            return
        tail = await steps.completed()
        finished = True
        await settle()
        if tail:
            yield tail
    finally:
        await settle()
