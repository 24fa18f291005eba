"""What a job publishes on the ``video.jobs`` channel, and its JSON-RPC notification.

Every state change of a job (created, submitted, progress, done, failed, cancelled,
timed out) publishes, after the change is committed::

    {"kind": "video", "job_id": "vid_...", "stream_id", "project_id": "<uuid>"|None,
     "user_id": "<uuid>"|None, "status", "progress", "result": {"url"}|None,
     "cost": float|None, "error": "message"|None}

``notification_of`` turns such an event, or a ``VideoJobOut`` read back for a late
subscriber (replay), into the notification a client receives.
"""

from __future__ import annotations

from typing import Any

import structlog

from app.db.models import VideoJob
from app.domain.video.schemas import VideoJobOut
from app.domain.video.views import public_id
from app.lib.events.base import EventBus

CHANNEL = "video.jobs"
CANCELLED = "cancelled"
logger = structlog.get_logger()


def job_event(row: VideoJob) -> dict[str, Any]:
    error = None
    if row.status == "failed":
        error = row.error or "failed"
    elif row.status == "cancelled":
        error = CANCELLED
    return {
        "kind": "video",
        "job_id": public_id(row.id),
        "stream_id": row.stream_id,
        "project_id": None if row.project_id is None else str(row.project_id),
        "user_id": None if row.user_id is None else str(row.user_id),
        "status": row.status,
        "progress": row.progress,
        "result": {"url": row.result_url} if row.result_url else None,
        "cost": row.cost,
        "error": error,
    }


def notification_of(source: dict[str, Any] | VideoJobOut) -> tuple[str, dict[str, Any]]:
    """The JSON-RPC notification (method, params) of an event or a job as read back."""
    if isinstance(source, VideoJobOut):
        job_id, stream_id, status = source.id, source.stream_id, source.status
        progress, cost = source.progress, source.cost
        result = None if source.result is None else {"url": source.result.url}
        error = None if source.error is None else source.error.message
    else:
        job_id, stream_id, status = source["job_id"], source["stream_id"], source["status"]
        progress, cost = source.get("progress", 0), source.get("cost")
        result, error = source.get("result"), source.get("error")
    if status == "done":
        return "video.done", {
            "job_id": job_id,
            "stream_id": stream_id,
            "result": result,
            "cost": cost,
        }
    if status == "cancelled":
        return "video.failed", {"job_id": job_id, "stream_id": stream_id, "error": CANCELLED}
    if status == "failed":
        return "video.failed", {
            "job_id": job_id,
            "stream_id": stream_id,
            "error": error or "failed",
        }
    return "video.progress", {
        "job_id": job_id,
        "stream_id": stream_id,
        "status": status,
        "progress": progress,
    }


async def publish_job(bus: EventBus, row: VideoJob) -> None:
    try:
        await bus.publish(CHANNEL, job_event(row))
    except Exception as exc:  # the change itself is committed; a late reader replays it
        logger.warning("could not publish a video job event", error=repr(exc))
