"""The ``video.*`` methods, on top of ``VideoJobs`` (the same service as the REST API).

Params (by name):

- ``video.create``: the body of ``POST /v1/video/generations`` -> ``{job_id, stream_id}``;
  on the WebSocket the socket follows the new job's stream at once;
- ``video.get`` ``{job_id}`` -> the job (as ``GET /v1/video/generations/{id}``);
- ``video.list`` ``{limit?: 1-100 = 20, offset?: >= 0 = 0}`` -> ``{items, total, limit,
  offset}``, newest first;
- ``video.cancel`` ``{job_id}`` -> the job, now ``cancelled`` (a finished job: -32000
  ``video_job_finished``);
- WebSocket only: ``video.subscribe`` ``{stream_id}`` -> ``{job_id, stream_id, status,
  progress}``, then the job's current state as a notification (a finished job sends
  its terminal one); ``video.unsubscribe`` ``{stream_id}`` -> ``{stream_id, watching:
  false}``.

Another owner's job or stream is "not found" (-32000, ``data.status`` 404), exactly
like a job that does not exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import structlog
from msgspec import Meta

from app.domain.paging import Offset
from app.domain.rpc.dispatch import Dispatcher, Method
from app.domain.rpc.live import Subscriber
from app.domain.rpc.protocol import APPLICATION_ERROR, METHOD_NOT_FOUND, RpcError
from app.domain.video.events import notification_of
from app.domain.video.facade import DEFAULT_LIST_LIMIT, ListLimit, VideoJobs, VideoOwner
from app.domain.video.schemas import VideoJobOut, VideoJobRequest
from app.lib.errors import NotFoundError

MAX_STREAMS = 256
"""Streams one socket may follow at once (finished ones no longer count)."""
SOCKET_ONLY = {
    "video.subscribe": "video.subscribe needs the WebSocket (/api/rpc/ws); over HTTP use "
    "the SSE sidecar GET /api/rpc/events?session=<stream_id>",
    "video.unsubscribe": "video.unsubscribe needs the WebSocket (/api/rpc/ws)",
}

After = Callable[[], Awaitable[None]]
logger = structlog.get_logger()


@dataclass(slots=True)
class RpcContext:
    owner: VideoOwner
    jobs: VideoJobs
    live: Subscriber | None = None
    """The socket's subscriber (None over HTTP)."""
    after: list[After] = field(default_factory=list)
    """Run once the answer is queued: replays go out after the answer they follow."""


class JobRef(msgspec.Struct, forbid_unknown_fields=True):
    job_id: Annotated[str, Meta(min_length=1, max_length=100)]


class StreamRef(msgspec.Struct, forbid_unknown_fields=True):
    stream_id: Annotated[str, Meta(min_length=1, max_length=64)]


class ListParams(msgspec.Struct, forbid_unknown_fields=True):
    limit: ListLimit = DEFAULT_LIST_LIMIT
    offset: Offset = 0


def stream_not_found() -> NotFoundError:
    return NotFoundError("no such video stream", code="video_stream_not_found")


def _follow(ctx: RpcContext, job: VideoJobOut) -> None:
    """Follow a job this socket just created: read it back once the answer is out (the
    poller may have moved it on before the watch began)."""
    live = ctx.live
    if live is None:
        return
    live.watch(job.stream_id)

    async def replay() -> None:
        current: VideoJobOut | None = None
        try:
            current = await ctx.jobs.find_stream(ctx.owner, job.stream_id)
        except Exception as exc:  # the periodic re-read catches up later
            logger.warning("could not read back a new video job", error=repr(exc))
        live.release(job.stream_id, notification_of(current or job))

    ctx.after.append(replay)


def _check_room(live: Subscriber, stream_id: str) -> None:
    if live.watching >= MAX_STREAMS and not live.is_watching(stream_id):
        raise RpcError(
            APPLICATION_ERROR,
            f"this socket follows {MAX_STREAMS} unfinished streams already",
            {"code": "too_many_streams", "status": 429},
        )


async def create(ctx: RpcContext, params: VideoJobRequest) -> dict[str, str]:
    if ctx.live is not None:
        _check_room(ctx.live, "")  # before the job exists: a refusal creates nothing
    job = await ctx.jobs.create(ctx.owner, params)
    _follow(ctx, job)
    return {"job_id": job.id, "stream_id": job.stream_id}


async def get(ctx: RpcContext, params: JobRef) -> VideoJobOut:
    return await ctx.jobs.get(ctx.owner, params.job_id)


async def list_jobs(ctx: RpcContext, params: ListParams) -> dict[str, Any]:
    items, total = await ctx.jobs.list(ctx.owner, limit=params.limit, offset=params.offset)
    return {"items": items, "total": total, "limit": params.limit, "offset": params.offset}


async def cancel(ctx: RpcContext, params: JobRef) -> VideoJobOut:
    return await ctx.jobs.cancel(ctx.owner, params.job_id)


async def subscribe(ctx: RpcContext, params: StreamRef) -> dict[str, Any]:
    live = ctx.live
    if live is None:  # the HTTP dispatcher does not offer it; kept safe anyway
        raise RpcError(METHOD_NOT_FOUND, SOCKET_ONLY["video.subscribe"])
    stream_id = params.stream_id
    _check_room(live, stream_id)
    fresh = not live.is_watching(stream_id)
    # Watch first, read second: whatever happens after the read arrives as an event.
    live.watch(stream_id)
    try:
        job = await ctx.jobs.find_stream(ctx.owner, stream_id)
    except BaseException:
        if fresh:
            live.unwatch(stream_id)
        raise
    if job is None:
        if fresh:
            live.unwatch(stream_id)
        raise stream_not_found()
    note = notification_of(job)

    async def replay() -> None:
        live.release(stream_id, note)

    ctx.after.append(replay)
    return {
        "job_id": job.id,
        "stream_id": stream_id,
        "status": job.status,
        "progress": job.progress,
    }


async def unsubscribe(ctx: RpcContext, params: StreamRef) -> dict[str, Any]:
    if ctx.live is not None:
        ctx.live.unwatch(params.stream_id)
    return {"stream_id": params.stream_id, "watching": False}


SHARED: tuple[Method[RpcContext], ...] = (
    Method("video.create", VideoJobRequest, create),
    Method("video.get", JobRef, get),
    Method("video.list", ListParams, list_jobs),
    Method("video.cancel", JobRef, cancel),
)
SOCKET: tuple[Method[RpcContext], ...] = (
    *SHARED,
    Method("video.subscribe", StreamRef, subscribe),
    Method("video.unsubscribe", StreamRef, unsubscribe),
)


def http_dispatcher(request_id: Callable[[], str | None]) -> Dispatcher[RpcContext]:
    return Dispatcher(SHARED, elsewhere=SOCKET_ONLY, request_id=request_id)


def socket_dispatcher(request_id: Callable[[], str | None]) -> Dispatcher[RpcContext]:
    return Dispatcher(SOCKET, request_id=request_id)
