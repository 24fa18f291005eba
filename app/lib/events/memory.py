"""In-process ``EventBus``: fan-out to per-subscriber bounded queues.

Events are JSON-encoded on publish and decoded per subscriber, exactly as on the
Redis bus. That costs a little, but an event that is not JSON-serializable (or a
subscriber that mutates a shared dict) then fails in the embedded default instead of
only in a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from app.lib.events.base import Event

_CLOSED = object()
"""Queued to wake subscribers when the bus closes."""

_decoder = msgspec.json.Decoder(dict[str, Any])


class _Subscription:
    """Async iterator over one subscriber's queue."""

    def __init__(self, max_queue: int) -> None:
        self._queue: asyncio.Queue[tuple[str, bytes] | object] = asyncio.Queue(max_queue)
        self._done = False
        self.dropped = 0
        """Events discarded because this subscriber fell behind."""

    def offer(self, item: tuple[str, bytes] | object) -> None:
        # Never block or fail the publisher: a slow subscriber loses its oldest events.
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(item)

    def end(self) -> None:
        self._done = True
        # Wakes a reader that is blocked in ``__anext__`` from another task.
        self.offer(_CLOSED)

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if not isinstance(item, tuple):
            self._done = True
            raise StopAsyncIteration
        channel, payload = item
        event = _decoder.decode(payload)
        event["channel"] = channel
        return event


class MemoryEventBus:
    """Single-process bus; ``max_queue`` bounds how far each subscriber may lag."""

    def __init__(self, *, max_queue: int = 1000) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self._max_queue = max_queue
        self._subscribers: dict[str, set[_Subscription]] = {}
        self._closed = False

    async def publish(self, channel: str, event: Event) -> None:
        payload = msgspec.json.encode(event)
        for sub in self._subscribers.get(channel, ()):
            sub.offer((channel, payload))

    @asynccontextmanager
    async def subscribe(self, *channels: str) -> AsyncIterator[AsyncIterator[Event]]:
        if not channels:
            raise ValueError("subscribe needs at least one channel")
        if self._closed:
            raise RuntimeError("event bus is closed")
        sub = _Subscription(self._max_queue)
        for channel in channels:
            self._subscribers.setdefault(channel, set()).add(sub)
        try:
            yield sub
        finally:
            sub.end()
            for channel in channels:
                subs = self._subscribers.get(channel)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._subscribers[channel]

    async def close(self) -> None:
        """End every open subscription's iteration; later ``subscribe`` calls fail."""
        self._closed = True
        for sub in {s for subs in self._subscribers.values() for s in subs}:
            sub.end()
        self._subscribers.clear()
