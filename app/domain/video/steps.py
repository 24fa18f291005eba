"""One step of one job, taken by the replica that holds its lease.

A queued job without a provider task is submitted (routing picks the backend); a job
with a task is polled on the backend that created it; a finished task's file is
resolved to its URL and the job is priced and metered. Every write is conditional on
the job still being active and this replica still holding the lease: a cancel (or
another replica that took the job over after this one stalled) always wins, and this
step then writes nothing. A final write releases the lease; one that reschedules the
job keeps it until ``lease`` past the next poll, so the same replica takes the next
step (and a dead one's job moves on once that runs out).

Failures: a provider's verdict (not retryable: bad parameters, content, balance, a
generation that failed) fails the job with the provider's message; anything that may
pass (transport errors, 5xx, rate limits, every video backend down) is retried with
the poll backoff until ``settings.video_timeout_seconds`` after the job's creation,
when the job fails as ``timed out`` (``video_timeout``). A job whose backend was
removed fails at its next poll (``video_backend_gone``): another backend does not
know the task.

One gap remains: a replica that dies after the provider accepted a task but before
its task id was written leaves the job queued, and the replica that takes it over
submits it again (MiniMax has no idempotency key). The window is one database write.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from app.db.models import VideoJob, VideoPrice
from app.domain.video import metering
from app.domain.video.events import publish_job
from app.domain.video.pricing import DEFAULT_MODE, MODES, Price, PriceMode, cost_of
from app.domain.video.schedule import SUBMITTED_PROGRESS, estimate_progress, next_poll_at
from app.domain.video.store import ACTIVE, JobStore
from app.lib.clock import utcnow
from app.lib.errors import AronaError
from app.lib.events.base import EventBus
from app.routing.backends.base import VideoBackend
from app.routing.errors import ModelNotFoundError, NoHealthyBackendError, UpstreamError
from app.routing.service import RoutingService
from app.routing.types import RouteHints, VideoPoll, VideoTask

logger = structlog.get_logger()

TIMED_OUT = "timed out"
TIMEOUT_CODE = "video_timeout"
PROVIDER_ERROR_CODE = "video_provider_error"
FAILED_CODE = "video_failed"
BACKEND_GONE_CODE = "video_backend_gone"


class JobStepper:
    def __init__(
        self,
        *,
        store: JobStore,
        routing: RoutingService,
        bus: EventBus,
        owner: str,
        lease: datetime.timedelta,
        poll_seconds: float,
        timeout_seconds: float,
    ) -> None:
        self._store = store
        self._routing = routing
        self._bus = bus
        self.owner = owner
        self._lease = lease
        self._poll_seconds = poll_seconds
        self._timeout = datetime.timedelta(seconds=timeout_seconds)

    def deadline(self, job: VideoJob) -> datetime.datetime:
        return job.created_at + self._timeout

    async def step(self, job: VideoJob) -> None:
        """Advance ``job`` by one step; never raises (but lets cancellation through)."""
        try:
            if utcnow() >= self.deadline(job):
                await self._fail(job, TIMED_OUT, TIMEOUT_CODE, metering.STATUS_TIMED_OUT)
            elif job.provider_task_id is None:
                await self._submit(job)
            else:
                await self._poll(job)
        except Exception as exc:
            # Our own bug or the database: the job waits for its next turn (or times out;
            # if even this write fails, the lease runs out and the job is claimed again).
            logger.warning("video job step failed", job_id=str(job.id), error=repr(exc))
            try:
                await self._reschedule(job, {})
            except Exception as again:
                logger.warning("video job not rescheduled", job_id=str(job.id), error=repr(again))

    # -- submission --------------------------------------------------------------------

    async def _submit(self, job: VideoJob) -> None:
        task = VideoTask(
            model=job.model,
            prompt=job.prompt,
            duration_seconds=job.duration_seconds,
            width=job.width,
            height=job.height,
            negative_prompt=job.negative_prompt,
            first_frame_image=job.first_frame_image,
            extra=dict(job.extra or {}),
        )
        hints = RouteHints(provider=job.provider_hint)
        try:
            submission = await self._routing.submit_video(job.model, task, hints)
        except ModelNotFoundError as exc:  # removed since the job was accepted
            await self._fail(job, exc.message, exc.code, exc.status_code)
            return
        except NoHealthyBackendError as exc:
            self._retrying(job, exc)
            await self._reschedule(job, {})
            return
        except UpstreamError as exc:
            if exc.retryable:
                self._retrying(job, exc)
                await self._reschedule(job, {})
            else:
                await self._fail(job, exc.message, PROVIDER_ERROR_CODE, metering.STATUS_FAILED)
            return
        now = utcnow()
        await self._write(
            job,
            {
                "status": "running",
                "progress": max(job.progress, SUBMITTED_PROGRESS),
                "backend": submission.backend,
                "model_served": submission.model_served,
                "provider_task_id": submission.task_id,
                "submitted_at": now,
                # The provider has the image now; the row need not carry it any longer.
                "first_frame_image": None,
                "polls": 0,
                "next_poll_at": next_poll_at(now, 0, self._poll_seconds, self.deadline(job)),
            },
        )

    # -- polling -----------------------------------------------------------------------

    async def _poll(self, job: VideoJob) -> None:
        backend = self._routing.video_backend(job.backend or "")
        if backend is None:
            message = f"backend {job.backend} that runs this job is no longer registered"
            await self._fail(job, message, BACKEND_GONE_CODE, metering.STATUS_FAILED)
            return
        assert job.provider_task_id is not None
        try:
            poll = await backend.poll_video(job.provider_task_id)
        except UpstreamError as exc:
            await self._upstream_failed(job, exc)
            return
        if poll.phase == "failed":
            message = poll.error or "video generation failed"
            await self._fail(job, message, FAILED_CODE, metering.STATUS_FAILED, poll)
        elif poll.phase == "succeeded":
            await self._finish(job, backend, poll)
        else:
            elapsed = (utcnow() - (job.submitted_at or job.created_at)).total_seconds()
            progress = estimate_progress(job.progress, poll.provider_status, elapsed)
            await self._reschedule(
                job, {"progress": progress, "provider_status": poll.provider_status[:32]}
            )

    async def _finish(self, job: VideoJob, backend: VideoBackend, poll: VideoPoll) -> None:
        file_id = poll.file_id or ""
        try:
            url = await backend.video_url(file_id)
        except UpstreamError as exc:
            await self._upstream_failed(job, exc, {"file_id": file_id[:200]})
            return
        price = await self._store.price_for([job.model_served or "", job.model])
        cost = cost_of(_price(price), job.duration_seconds, job.width, job.height)
        now = utcnow()

        def usage(row: VideoJob) -> dict[str, Any]:
            return metering.usage_row(
                row,
                status=metering.STATUS_DONE,
                cost=cost,
                currency=None if price is None else price.currency,
            )

        await self._write(
            job,
            {
                "status": "done",
                "progress": 100,
                "provider_status": poll.provider_status[:32],
                "file_id": file_id[:200],
                "result_url": url,
                "cost": cost,
                "finished_at": now,
                "next_poll_at": None,
            },
            usage=usage,
        )

    async def _upstream_failed(
        self, job: VideoJob, exc: UpstreamError, values: Mapping[str, Any] | None = None
    ) -> None:
        if exc.retryable:
            self._retrying(job, exc)
            await self._reschedule(job, values or {})
        else:
            await self._fail(job, exc.message, PROVIDER_ERROR_CODE, metering.STATUS_FAILED)

    # -- writes ------------------------------------------------------------------------

    async def _fail(
        self,
        job: VideoJob,
        message: str,
        code: str,
        status: int,
        poll: VideoPoll | None = None,
    ) -> None:
        def usage(row: VideoJob) -> dict[str, Any]:
            return metering.usage_row(row, status=status, error_code=code)

        values: dict[str, Any] = {
            "status": "failed",
            "error": message,
            "error_code": code[:64],
            "finished_at": utcnow(),
            "next_poll_at": None,
            "first_frame_image": None,
        }
        if poll is not None:
            values["provider_status"] = poll.provider_status[:32]
        await self._write(job, values, usage=usage)

    async def _reschedule(self, job: VideoJob, values: Mapping[str, Any]) -> None:
        steps = job.polls + 1
        when = next_poll_at(utcnow(), steps, self._poll_seconds, self.deadline(job))
        await self._write(job, {**values, "polls": steps, "next_poll_at": when})

    async def _write(
        self,
        job: VideoJob,
        values: Mapping[str, Any],
        *,
        usage: Callable[[VideoJob], Mapping[str, Any]] | None = None,
    ) -> None:
        now = utcnow()
        changes: dict[str, Any] = {**values, "updated_at": now}
        if values.get("status", job.status) in ACTIVE:
            due = values.get("next_poll_at", now)
            changes["lease_expires_at"] = max(due, now) + self._lease
        else:
            changes["lease_owner"] = None
            changes["lease_expires_at"] = None
        row = await self._store.update_if(job.id, changes, lease_owner=self.owner, usage=usage)
        if row is None:
            return  # cancelled meanwhile, or the lease went to another replica
        if _visible_change(job, row):
            await publish_job(self._bus, row)

    def _retrying(self, job: VideoJob, exc: AronaError) -> None:
        # Debug only: a provider that is down would otherwise log a line per job per poll.
        logger.debug("video job step will be retried", job_id=str(job.id), error=exc.message[:300])


def _visible_change(before: VideoJob, after: VideoJob) -> bool:
    return (before.status, before.progress, before.result_url) != (
        after.status,
        after.progress,
        after.result_url,
    )


def _price(row: VideoPrice | None) -> Price | None:
    if row is None:
        return None
    return Price(
        mode=_mode(row.mode),
        base=float(row.base or 0.0),
        price_per_second=float(row.price_per_second or 0.0),
        resolution_coeffs=dict(row.resolution_coeffs or {}),
        price_per_frame=float(row.price_per_frame or 0.0),
        fps=float(row.fps or 24.0),
    )


def _mode(value: str | None) -> PriceMode:
    for mode in MODES:
        if value == mode:
            return mode
    return DEFAULT_MODE
