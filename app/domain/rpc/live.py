"""Live job notifications for this replica's sockets and SSE streams.

One ``LiveHub`` per app holds one subscription to the ``video.jobs`` channel (not one
per connection: a socket must not cost a Redis connection) while anyone listens, and
hands each event to the ``Subscriber``s (one per socket or SSE stream) watching that
event's stream id. Events come from whichever replica changed the job.

No race between "subscribe" and "the job finished": a subscriber starts watching a
stream before the job's state is read back (``watch`` then ``release`` with the
replay), and the hub's own subscription is confirmed before any subscriber is
handed out. While a stream is held (between ``watch`` and ``release``) its live
events are kept, not sent, so a method's answer goes out before the notifications it
started.

What a subscriber sends per stream only moves forward: ``queued`` < ``running`` (by
progress) < the terminal event; a repeat or an older state (a replay that read the
database just before a live event arrived) is dropped, and after the terminal event
the stream is forgotten. So a client sees each state at most once, in order, and
exactly one ``video.done``/``video.failed``.

A slow client never holds up the hub: each subscriber has a bounded queue of encoded
messages (``capacity``); the hub only ever ``put_nowait``s, and a full queue ends
that subscriber (``end_reason == OVERFLOW``; its socket closes with 1008, its SSE
stream ends; the client reconnects and the replay catches it up). When the hub's own
subscription fails or the bus closes, every subscriber ends with ``LOST``; the next
subscriber starts a new subscription. The hub subscription stops with its last
subscriber, so nothing runs after the app's connections are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from app.lib.events.base import Event, EventBus

logger = structlog.get_logger()

Notification = tuple[str, dict[str, Any]]
"""A notification's method and params."""
Outgoing = tuple[bytes, bool]
"""An encoded message and whether it is a stream's terminal notification."""
Encode = Callable[[str, dict[str, Any]], bytes]
Translate = Callable[[dict[str, Any]], Notification]

TERMINAL = frozenset({"video.done", "video.failed"})
OVERFLOW = "overflow"
LOST = "lost"


class SubscriberEndedError(Exception):
    """The subscriber ended (``OVERFLOW`` or ``LOST``): its connection should close."""


class FeedUnavailableError(Exception):
    """The hub could not subscribe to the bus (Redis down): nothing live to offer."""


def order_of(note: Notification) -> tuple[int, int]:
    """Where a notification sits in a job's life; what a stream sends only grows."""
    method, params = note
    if method in TERMINAL:
        return (2, 0)
    progress = params.get("progress")
    step = progress if isinstance(progress, int) and not isinstance(progress, bool) else 0
    return (1 if params.get("status") == "running" else 0, step)


@dataclass(slots=True)
class _Stream:
    sent: tuple[int, int] | None = None
    held: Notification | None = None
    holding: bool = True


class Subscriber:
    """One connection's watched streams and its bounded queue of outgoing messages."""

    def __init__(self, hub: LiveHub, capacity: int, encode: Encode) -> None:
        self._hub = hub
        self._encode = encode
        self._streams: dict[str, _Stream] = {}
        self.queue: asyncio.Queue[Outgoing] = asyncio.Queue(capacity)
        self.ended = asyncio.Event()
        self.end_reason: str | None = None

    @property
    def watching(self) -> int:
        return len(self._streams)

    def is_watching(self, stream_id: str) -> bool:
        return stream_id in self._streams

    def live_streams(self) -> list[str]:
        """The watched streams past their replay (what a periodic re-read refreshes)."""
        return [stream_id for stream_id, s in self._streams.items() if not s.holding]

    async def next_message(self, wait: float | None = None) -> Outgoing | None:
        """The next queued message; None after ``wait`` seconds without one.
        Raises ``SubscriberEndedError`` once the subscriber has ended."""
        if self.end_reason is not None:
            raise SubscriberEndedError(self.end_reason)
        if not self.queue.empty():
            return self.queue.get_nowait()
        getter = asyncio.ensure_future(self.queue.get())
        ender = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({getter, ender}, timeout=wait, return_when=FIRST_COMPLETED)
        finally:
            ender.cancel()
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        if self.end_reason is not None:
            raise SubscriberEndedError(self.end_reason)
        return None

    def watch(self, stream_id: str) -> None:
        """Start collecting the stream's events (held until ``release``)."""
        if self.end_reason is not None or stream_id in self._streams:
            return
        self._streams[stream_id] = _Stream()
        self._hub._index.setdefault(stream_id, set()).add(self)

    def release(self, stream_id: str, replay: Notification | None) -> None:
        """Send the newer of the replayed state and what arrived meanwhile; from now on
        events go out as they come."""
        stream = self._streams.get(stream_id)
        if stream is None or not stream.holding:
            return
        stream.holding = False
        held, stream.held = stream.held, None
        best = max(
            (note for note in (replay, held) if note is not None), key=order_of, default=None
        )
        if best is not None:
            self._send(stream_id, stream, best)

    def unwatch(self, stream_id: str) -> None:
        if self._streams.pop(stream_id, None) is not None:
            self._hub._forget(stream_id, self)

    def offer(self, stream_id: str, note: Notification) -> None:
        """A live event for a watched stream (called by the hub, never blocks)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.holding:
            if stream.held is None or order_of(note) > order_of(stream.held):
                stream.held = note
            return
        self._send(stream_id, stream, note)

    def _send(self, stream_id: str, stream: _Stream, note: Notification) -> None:
        order = order_of(note)
        if stream.sent is not None and order <= stream.sent:
            return
        stream.sent = order
        terminal = note[0] in TERMINAL
        if terminal:
            self.unwatch(stream_id)
        try:
            self.queue.put_nowait((self._encode(*note), terminal))
        except asyncio.QueueFull:
            self.end(OVERFLOW)

    def end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self._hub._detach(self)
        self.ended.set()


class LiveHub:
    def __init__(self, bus: EventBus, channel: str, translate: Translate) -> None:
        self._bus = bus
        self._channel = channel
        self._translate = translate
        self._subscribers: set[Subscriber] = set()
        self._index: dict[str, set[Subscriber]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def watched_streams(self) -> int:
        return len(self._index)

    @contextlib.asynccontextmanager
    async def subscriber(self, *, capacity: int, encode: Encode) -> AsyncIterator[Subscriber]:
        """A subscriber, once the hub's bus subscription is live; released on exit.
        Raises ``FeedUnavailableError`` when the bus cannot be subscribed to."""
        sub = Subscriber(self, capacity, encode)
        self._subscribers.add(sub)
        try:
            await self._running()
            yield sub
        finally:
            self._detach(sub)

    async def _running(self) -> None:
        if self._task is None or self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            # Read the outcome even if every waiter has gone, so it is never "unretrieved".
            self._ready.add_done_callback(_consume)
            self._task = asyncio.create_task(self._run(self._ready), name="rpc-live-hub")
        try:
            # Shielded: one subscriber giving up must not cancel the start for others.
            await asyncio.shield(self._ready)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise FeedUnavailableError(str(exc)) from exc

    async def _run(self, ready: asyncio.Future[None]) -> None:
        reason = "the event bus closed"
        try:
            async with self._bus.subscribe(self._channel) as events:
                ready.set_result(None)
                async for event in events:
                    self._dispatch(event)
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(FeedUnavailableError("stopped"))
            raise
        except Exception as exc:
            reason = repr(exc)
            if not ready.done():
                ready.set_exception(exc)
            logger.warning("live video notifications lost their subscription", error=reason)
        if not ready.done():
            ready.set_exception(FeedUnavailableError(reason))
        if self._task is asyncio.current_task():
            self._task = self._ready = None
            for sub in list(self._subscribers):
                sub.end(LOST)

    def _dispatch(self, event: Event) -> None:
        stream_id = event.get("stream_id")
        if not isinstance(stream_id, str):
            return
        watchers = self._index.get(stream_id)
        if not watchers:
            return
        try:
            note = self._translate(event)
        except Exception as exc:  # a malformed event must not end the feed
            logger.warning("skipping a malformed video event", error=repr(exc))
            return
        for sub in list(watchers):
            sub.offer(stream_id, note)

    def _forget(self, stream_id: str, sub: Subscriber) -> None:
        watchers = self._index.get(stream_id)
        if watchers is not None:
            watchers.discard(sub)
            if not watchers:
                del self._index[stream_id]

    def _detach(self, sub: Subscriber) -> None:
        for stream_id in list(sub._streams):
            self._forget(stream_id, sub)
        sub._streams.clear()
        self._subscribers.discard(sub)
        if not self._subscribers and self._task is not None:
            # Nobody listens: stop following the channel until someone does again.
            self._task.cancel()
            self._task = self._ready = None


def _consume(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
