"""The usage record of a finished job: one per job, however it ended.

Written with the job's final state in one transaction (``JobStore.update_if``), not
through the batched ``UsageWriter``: whichever write makes the job final (the
poller's, or a cancel) also meters it, so a job is metered exactly once even when a
cancel races a step or a replica dies. Cancelled jobs are recorded as 499 (like a
client that went away), provider failures as 502, timeouts as 504; only a done job
carries a cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.db.models import VideoJob
from app.domain.calls.metering import CLIENT_CLOSED_STATUS, MICROS, CallRecord
from app.domain.calls.metering import usage_row as entry_row
from app.lib.clock import utcnow
from app.lib.errors import AronaError

if TYPE_CHECKING:
    from app.domain.video.facade import VideoOwner

ENDPOINT = "video.generations"
# The HTTP status a synchronous call would have answered with, so usage reports read
# video jobs like any other call.
STATUS_DONE = 200
STATUS_CANCELLED = CLIENT_CLOSED_STATUS
STATUS_FAILED = 502
STATUS_TIMED_OUT = 504
DEFAULT_CURRENCY = "USD"
"""A video price without a currency is in the platform's (the price book's default)."""


def usage_row(
    job: VideoJob,
    *,
    status: int,
    error_code: str | None = None,
    cost: float | None = None,
    currency: str | None = None,
    backend: str | None = None,
    model_served: str | None = None,
) -> dict[str, Any]:
    """The job's usage record as the values of its INSERT (the shared record, priced)."""
    now = utcnow()
    started = job.created_at or now
    record = CallRecord(
        endpoint=ENDPOINT,
        model_requested=job.model[:200],
        project_id=job.project_id,
        api_key_id=job.api_key_id,
        user_id=job.user_id,
        backend=backend or job.backend,
        model_served=model_served or job.model_served,
        status=status,
        error_code=None if error_code is None else error_code[:64],
    )
    # Video keeps its own pricing modes; the amount joins the exact columns as well.
    record.priced(None if cost is None else round(cost * MICROS), currency or DEFAULT_CURRENCY)
    latency_ms = max(0, int((now - started).total_seconds() * 1000))
    return entry_row(record.entry(latency_ms=latency_ms, created_at=now))


def refused(owner: VideoOwner, model: str, error: AronaError, started: float) -> CallRecord:
    """The record of a creation refused before any job existed (the quota's 429 or
    503), for the request path's ``Meter``."""
    record = CallRecord(
        endpoint=ENDPOINT,
        model_requested=model[:200],
        started=started,
        project_id=owner.project_id,
        api_key_id=owner.api_key_id,
        user_id=owner.user_id,
    )
    record.failed(error)
    return record
