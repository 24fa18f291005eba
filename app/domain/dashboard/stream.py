"""Server-sent events for the dashboard: one stream per live page, fed by the EventBus.

A page declares ``hx-ext="sse" sse-connect="/admin/stream/<page>"``; each live part of
it carries ``sse-swap="<event name>"`` and is replaced by the HTML fragment that event
carries. How a stream runs (``feed_events``):

- it subscribes to the page's EventBus channels *before* its first byte, so an event
  published once the client has seen the stream open is never missed, whichever
  replica published it (the Redis bus fans out to every replica);
- its first bytes are ``retry:`` (the browser's reconnect delay) and a full snapshot
  of every live part: after a drop, the reconnected page catches up on what it missed;
- then fragments follow on bus events and on a timer (``Feed.tick_seconds``: vLLM load,
  latencies); a feed sends a fragment only when its HTML changed (``SentCache``);
- a ``ping`` event goes out with the snapshot and then every ``HEARTBEAT_SECONDS``
  (whatever else is sent), carrying that interval in milliseconds: proxies and load
  balancers keep an idle stream open, and the page (``static/js/live.js``) knows the
  stream is alive, and shows it disconnected when pings stop coming;
- it ends by itself after ``MAX_SECONDS``; the page reconnects about a second later
  (``live.js`` backs off further when that fails; ``RETRY_MS`` is for other clients),
  which checks the session again (a logged-out or demoted admin loses the stream) and
  bounds how long an open page can hold up a server's graceful shutdown (uvicorn
  waits for open responses unless ``timeout_graceful_shutdown`` is set);
- a client that goes away ends it at once: ``send_event_stream`` cancels the relay and
  closes the generator, which leaves ``bus.subscribe`` (the Redis subscription's
  connection is dropped, the in-memory subscriber removed).

Bus events are read by a pump task into a small queue, so waiting for "an event or
the next tick" never cancels a read on the bus connection itself. The response is not
buffered: every frame is its own ASGI body message, sent with ``Cache-Control:
no-cache`` and ``X-Accel-Buffering: no``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Protocol, runtime_checkable

import structlog
from litestar.types import Receive, Scope, Send

from app.domain.asgi_stream import send_event_stream
from app.lib.events.base import Event, EventBus

HEARTBEAT_SECONDS = 15.0
MAX_SECONDS = 60.0
RETRY_MS = 2000
QUEUE_SIZE = 256

_EVENT_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,160}$")
_END = object()

Fragment = tuple[str, str]
"""An SSE event name and the HTML fragment it carries."""

logger = structlog.get_logger()


@runtime_checkable  # a stream handler's ``feed`` dependency is checked against it
class Feed(Protocol):
    """What a page streams: its channels, a snapshot, and fragments on change."""

    channels: tuple[str, ...]
    tick_seconds: float

    async def snapshot(self) -> list[Fragment]:
        """Every live part of the page (sent first, again after each reconnect)."""
        ...

    async def on_event(self, event: Event) -> list[Fragment]:
        """Fragments to send for one bus event (only those that changed)."""
        ...

    async def on_tick(self) -> list[Fragment]:
        """Fragments to send on the timer (only those that changed)."""
        ...


class SentCache:
    """The HTML last sent per event name, so unchanged fragments are not sent again."""

    def __init__(self) -> None:
        self._sent: dict[str, str] = {}

    def changed(self, fragments: Iterable[Fragment]) -> list[Fragment]:
        fresh = [(name, html) for name, html in fragments if self._sent.get(name) != html]
        self.record(fresh)
        return fresh

    def record(self, fragments: Iterable[Fragment]) -> None:
        for name, html in fragments:
            self._sent[name] = html

    def forget(self, names: Iterable[str]) -> None:
        for name in names:
            self._sent.pop(name, None)


def encode(fragments: Iterable[Fragment]) -> bytes:
    """SSE frames: ``event: <name>`` and the HTML, one ``data:`` line per line."""
    out: list[str] = []
    for name, html in fragments:
        if not _EVENT_NAME.match(name):
            raise ValueError(f"not a safe SSE event name: {name!r}")
        out.append(f"event: {name}\n")
        for line in html.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            out.append(f"data: {line}\n")
        out.append("\n")
    return "".join(out).encode()


def ping_frame(heartbeat: float) -> bytes:
    """The heartbeat event: its data is the interval in milliseconds."""
    return f"event: ping\ndata: {round(heartbeat * 1000)}\n\n".encode()


def _offer(queue: asyncio.Queue[object], item: object) -> None:
    # Never block the pump: when the page falls behind, the oldest hint goes (events
    # are hints; the next tick renders from the current state anyway).
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(item)


async def _pump(events: AsyncIterator[Event], queue: asyncio.Queue[object]) -> None:
    try:
        async for event in events:
            _offer(queue, event)
    except Exception as exc:
        logger.warning("dashboard stream lost its event subscription", error=repr(exc))
    finally:
        _offer(queue, _END)


async def feed_events(
    bus: EventBus,
    feed: Feed,
    *,
    heartbeat: float | None = None,
    max_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of one client's stream (see the module docstring); it ends after
    ``max_seconds`` and pings every ``heartbeat`` (defaults ``MAX_SECONDS`` and
    ``HEARTBEAT_SECONDS``, read when the stream starts)."""
    lifetime = MAX_SECONDS if max_seconds is None else max_seconds
    every = HEARTBEAT_SECONDS if heartbeat is None else heartbeat
    ping = ping_frame(every)
    queue: asyncio.Queue[object] = asyncio.Queue(QUEUE_SIZE)
    async with bus.subscribe(*feed.channels) as events:
        pump = asyncio.create_task(_pump(events, queue), name="dashboard-stream-pump")
        try:
            try:
                opening = encode(await feed.snapshot())
            except Exception as exc:  # the browser reconnects and tries again
                logger.warning("dashboard stream could not start", error=repr(exc))
                return
            yield f"retry: {RETRY_MS}\n\n".encode() + opening + ping
            started = last_ping = clock()
            next_tick = started + feed.tick_seconds
            while True:
                now = clock()
                if now - started >= lifetime:
                    return
                deadline = min(next_tick, last_ping + every, started + lifetime)
                try:
                    item = await asyncio.wait_for(queue.get(), max(0.0, deadline - now))
                except TimeoutError:
                    item = None
                if item is _END:
                    return  # the bus went away: the browser reconnects and resubscribes
                tick_due = item is None and clock() >= next_tick
                fragments = await _step(feed, item, tick_due)
                if tick_due:
                    next_tick = clock() + feed.tick_seconds
                if fragments:
                    yield encode(fragments)
                if clock() - last_ping >= every:
                    yield ping
                    last_ping = clock()
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)


async def _step(feed: Feed, item: object, tick_due: bool) -> list[Fragment]:
    try:
        if isinstance(item, dict):
            return await feed.on_event(item)
        if tick_due:
            return await feed.on_tick()
    except Exception as exc:  # a database hiccup: keep the stream, try again next time
        logger.warning("dashboard stream could not render an update", error=repr(exc))
    return []


class EventStreamResponse:
    """Returned by a stream handler: relays ``feed_events`` until the client leaves."""

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_event_stream(send, receive, self._events)
