"""The usage record of a finished job: one per job, however it ended.

Written with the job's final state in one transaction (``JobStore.update_if``), not
through the batched ``UsageWriter``: whichever write makes the job final (the
poller's, or a cancel) also meters it, so a job is metered exactly once even when a
cancel races a step or a replica dies. Cancelled jobs are recorded as 499 (like a
client that went away), provider failures as 502, timeouts as 504; only a done job
carries a cost.
"""

from __future__ import annotations

from typing import Any

from app.db.models import VideoJob
from app.lib.clock import utcnow
from app.lib.ids import uuid7

ENDPOINT = "video.generations"
# The HTTP status a synchronous call would have answered with, so usage reports read
# video jobs like any other call.
STATUS_DONE = 200
STATUS_CANCELLED = 499
STATUS_FAILED = 502
STATUS_TIMED_OUT = 504


def usage_row(
    job: VideoJob,
    *,
    status: int,
    error_code: str | None = None,
    cost: float | None = None,
    backend: str | None = None,
    model_served: str | None = None,
) -> dict[str, Any]:
    now = utcnow()
    started = job.created_at or now
    return {
        "id": uuid7(),
        "project_id": job.project_id,
        "api_key_id": job.api_key_id,
        "user_id": job.user_id,
        "model_requested": job.model[:200],
        "model_served": model_served or job.model_served,
        "backend": backend or job.backend,
        "endpoint": ENDPOINT,
        "streamed": False,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "estimated": False,
        "status": status,
        "error_code": None if error_code is None else error_code[:64],
        "latency_ms": max(0, int((now - started).total_seconds() * 1000)),
        "ttft_ms": None,
        "conversation_id": None,
        "model_profile_id": None,
        "is_custom": False,
        "is_override_key": False,
        "cost": cost,
        "created_at": now,
    }
