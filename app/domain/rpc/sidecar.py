"""``GET /api/rpc/events?session=<stream_id>``: one job's notifications as SSE.

For clients that speak JSON-RPC over HTTP and want the notifications a WebSocket
client gets. The caller must own the stream (else 404, like a job of another
project); refusals are JSON-RPC error bodies with their HTTP status. Then:

- the job's current state goes out first (replay: a stream opened after the job
  finished gets its terminal event at once), then each change as it happens, as
  ``event: video.progress|video.done|video.failed`` with ``data: {params}`` (the
  params of the WebSocket notification);
- a comment line (``: ping``) after ``HEARTBEAT_SECONDS`` of silence keeps proxies
  from closing an idle stream; every ``RESYNC_SECONDS`` of silence the job is read
  again, so a change whose event was lost (a Redis outage) still arrives;
- the stream ends after the terminal event, when the client leaves (the hub
  subscription is released at once), when the client reads too slowly to keep up
  (``QUEUE_SIZE`` messages behind) or when the live feed is lost; in the last two
  cases a reconnect replays the current state.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import msgspec
import structlog
from litestar.types import Receive, Scope, Send

from app.domain.asgi_stream import send_event_stream
from app.domain.calls.callers import CallerResolver
from app.domain.rpc.live import FeedUnavailableError, LiveHub, Subscriber, SubscriberEndedError
from app.domain.rpc.methods import stream_not_found
from app.domain.rpc.protocol import invalid_params
from app.domain.rpc.transport import (
    ASGIHandler,
    admitted_owner,
    failure,
    guarded,
    send_error,
    send_json,
)
from app.domain.video.events import notification_of
from app.domain.video.facade import VideoJobs, VideoOwner
from app.lib.errors import ServiceUnavailableError

HEARTBEAT_SECONDS = 15.0
RESYNC_SECONDS = 30.0
QUEUE_SIZE = 64
PING = b": ping\n\n"
MAX_STREAM_ID = 64

logger = structlog.get_logger()


def sse_frame(method: str, params: dict[str, Any]) -> bytes:
    # Compact JSON has no newline, so one ``data:`` line carries it.
    return b"event: " + method.encode() + b"\ndata: " + msgspec.json.encode(params) + b"\n\n"


def _session(scope: Scope) -> str | None:
    query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
    values = query.get("session") or []
    return values[0] if len(values) == 1 else None


async def stream_frames(
    sub: Subscriber,
    stream_id: str,
    refresh: Callable[[], Awaitable[None]],
    *,
    heartbeat: float = HEARTBEAT_SECONDS,
    resync: float = RESYNC_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of one watched stream until its terminal event."""
    last_read = clock()
    while True:
        try:
            item = await sub.next_message(heartbeat)
        except SubscriberEndedError as exc:
            logger.info("rpc event stream ended early", stream=stream_id, reason=str(exc))
            return
        if item is not None:
            frame, terminal = item
            yield frame
            if terminal:
                return
            continue
        yield PING
        if clock() - last_read >= resync:
            last_read = clock()
            try:
                await refresh()
            except Exception as exc:  # a database hiccup: the next resync tries again
                logger.warning("could not re-read a video job", error=repr(exc))


def rpc_events_handler(callers: CallerResolver, jobs: VideoJobs, hub: LiveHub) -> ASGIHandler:
    async def rpc_events(scope: Scope, receive: Receive, send: Send) -> None:
        owner = await admitted_owner(callers, scope, send, method="GET", wrong_method="use GET")
        if owner is None:
            return
        stream_id = _session(scope)
        if not stream_id or len(stream_id) > MAX_STREAM_ID:
            error = invalid_params("pass the job's stream id as ?session=<stream_id>", "session")
            await send_error(send, 400, error)
            return
        try:
            async with hub.subscriber(capacity=QUEUE_SIZE, encode=sse_frame) as sub:
                await _serve(receive, send, owner, jobs, sub, stream_id)
        except FeedUnavailableError:
            unavailable = ServiceUnavailableError(
                "live notifications are unavailable right now; poll video.get",
                code="events_unavailable",
            )
            await send_json(send, *failure(unavailable))

    return guarded(rpc_events)


async def _serve(
    receive: Receive,
    send: Send,
    owner: VideoOwner,
    jobs: VideoJobs,
    sub: Subscriber,
    stream_id: str,
) -> None:
    sub.watch(stream_id)  # before the read: a change after it arrives as an event
    job = await jobs.find_stream(owner, stream_id)
    if job is None:
        await send_json(send, *failure(stream_not_found()))
        return
    sub.release(stream_id, notification_of(job))

    async def refresh() -> None:
        current = await jobs.find_stream(owner, stream_id)
        if current is not None:
            sub.offer(stream_id, notification_of(current))

    await send_event_stream(send, receive, stream_frames(sub, stream_id, refresh))
