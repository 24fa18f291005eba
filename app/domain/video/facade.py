"""``VideoJobs``: what the REST API, JSON-RPC and the dashboard do with video jobs.

``create`` validates, checks the quota and that a video backend advertises the model,
persists the job as ``queued`` and returns at once: the poller (``poller.py``) submits
it to the provider and drives it from there. Every change is published on the
``video.jobs`` channel (``events.py``).

Ownership: a job belongs to its project when it was created with a project API key,
else to the user whose token created it; anyone else gets a 404, never a 403.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

import msgspec

from app.db.models import VideoJob
from app.domain.calls.admission import CallAdmission
from app.domain.calls.callers import Caller, CallKey
from app.domain.calls.metering import Meter
from app.domain.video import metering
from app.domain.video.events import CANCELLED, publish_job
from app.domain.video.schemas import VideoJobOut, VideoJobRequest
from app.domain.video.store import ACTIVE, JobStore, OwnerScope
from app.domain.video.validation import ValidRequest, validate
from app.domain.video.views import job_out, parse_public_id
from app.lib.clock import utcnow
from app.lib.errors import AronaError, BadRequestError, ConflictError, NotFoundError
from app.lib.events.base import EventBus
from app.routing.errors import NoHealthyBackendError
from app.routing.router import Router
from app.routing.types import RouteHints

DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
ListLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_LIST_LIMIT)]
"""``limit`` of a job list (REST and JSON-RPC); ``offset`` is the shared ``Offset``."""


@dataclass(frozen=True, slots=True)
class VideoOwner:
    project_id: UUID | None
    api_key_id: UUID | None
    user_id: UUID | None
    key: CallKey | None = None
    """The calling key's governance (allowed models, rate)."""

    @classmethod
    def of(cls, caller: Caller) -> VideoOwner:
        return cls(caller.project_id, caller.api_key_id, caller.user_id, caller.key)

    @property
    def scope(self) -> OwnerScope:
        return OwnerScope(self.project_id, None if self.project_id else self.user_id)


def _cancelled_usage(row: VideoJob) -> dict[str, Any]:
    return metering.usage_row(row, status=metering.STATUS_CANCELLED, error_code=CANCELLED)


def job_not_found(job_id: str) -> NotFoundError:
    return NotFoundError(f"no video job {job_id[:80]}", code="video_job_not_found", param="id")


class VideoJobs:
    """A plain class, not a dataclass: Litestar would otherwise walk its fields' types
    when it is injected into a handler."""

    def __init__(
        self,
        *,
        store: JobStore,
        router: Router,
        admission: CallAdmission,
        meter: Meter,
        bus: EventBus,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """``wake`` is called after each new job (this replica's poller looks at once)."""
        self.store = store
        self._router = router
        self._admission = admission
        self._meter = meter
        self._bus = bus
        self._wake = wake

    async def create(self, owner: VideoOwner, request: VideoJobRequest) -> VideoJobOut:
        """Validate, check the model, then the quota (an invalid request or an unknown
        model uses none of it), and persist the job queued.

        The quota counts a job once, when it is created (``CallAdmission.admit_job``),
        as it counts a chat call when it is admitted: a job that fails later still
        counted. A creation the quota refuses is metered at once, as every refused
        call is (there is no job); a job's own usage record is written when it ends.
        """
        valid = validate(request)
        self._check_model(valid)
        try:
            await self._admission.admit_job(owner.project_id, model=valid.model, key=owner.key)
        except AronaError as exc:
            await self._meter.record(metering.refused(owner, valid.model, exc, self._meter.now()))
            raise
        now = utcnow()
        row = VideoJob(
            id=uuid.uuid4(),
            project_id=owner.project_id,
            api_key_id=owner.api_key_id,
            user_id=owner.user_id,
            model=valid.model,
            provider_hint=valid.provider,
            stream_id=uuid.uuid4().hex,
            prompt=valid.prompt,
            negative_prompt=valid.negative_prompt,
            duration_seconds=valid.duration_seconds,
            width=valid.width,
            height=valid.height,
            first_frame_image=valid.first_frame_image,
            extra=valid.extra,
            status="queued",
            progress=0,
            polls=0,
            next_poll_at=now,
            created_at=now,
            updated_at=now,
        )
        row = await self.store.insert(row)
        await publish_job(self._bus, row)
        if self._wake is not None:
            self._wake()
        return job_out(row)

    def _check_model(self, valid: ValidRequest) -> None:
        """404 ``model_not_found`` when no backend advertises the model, 400
        ``not_a_video_model`` when only chat or embeddings backends do. A model whose
        video backends are all down right now is accepted: the poller submits it once
        one is back (or the job times out)."""
        try:
            self._router.candidates(
                self._router.resolve(valid.model), "video", RouteHints(provider=valid.provider)
            )
        except NoHealthyBackendError:
            return

    async def get(self, owner: VideoOwner, job_id: str) -> VideoJobOut:
        return job_out(await self._require(owner, job_id))

    async def _require(self, owner: VideoOwner, job_id: str) -> VideoJob:
        parsed = parse_public_id(job_id)
        row = None if parsed is None else await self.store.get(parsed, owner.scope)
        if row is None:
            raise job_not_found(job_id)
        return row

    async def list(
        self, owner: VideoOwner, *, limit: int = DEFAULT_LIST_LIMIT, offset: int = 0
    ) -> tuple[builtins.list[VideoJobOut], int]:
        """The owner's jobs, newest first, and how many there are in all."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise BadRequestError(f"`limit` must be between 1 and {MAX_LIST_LIMIT}", param="limit")
        if offset < 0:
            raise BadRequestError("`offset` must not be negative", param="offset")
        rows, total = await self.store.page(owner.scope, limit, offset)
        return [job_out(r) for r in rows], total

    async def cancel(self, owner: VideoOwner, job_id: str) -> VideoJobOut:
        """queued/running -> cancelled; a finished job is a 409 ``video_job_finished``.

        One conditional UPDATE: a poller step racing it either committed first (the
        cancel then sees a finished job, or still an active one) or finds the job
        cancelled and writes nothing. The provider's task is left to run out (MiniMax
        has no cancel); nothing of it is fetched or billed."""
        existing = await self._require(owner, job_id)
        now = utcnow()
        row = await self.store.update_if(
            existing.id,
            {
                "status": "cancelled",
                "error": CANCELLED,
                "error_code": CANCELLED,
                "finished_at": now,
                "updated_at": now,
                "next_poll_at": None,
                "lease_owner": None,
                "lease_expires_at": None,
                "first_frame_image": None,
            },
            statuses=ACTIVE,
            scope=owner.scope,
            usage=_cancelled_usage,
        )
        if row is None:
            current = await self._require(owner, job_id)
            raise ConflictError(
                f"this video job is {current.status} already: there is nothing to cancel",
                code="video_job_finished",
            )
        await publish_job(self._bus, row)
        return job_out(row)

    async def find_stream(self, owner: VideoOwner, stream_id: str) -> VideoJobOut | None:
        """The job of a notification stream, if ``owner`` owns it (to replay its state)."""
        if not stream_id or len(stream_id) > 64:
            return None
        row = await self.store.by_stream(stream_id, owner.scope)
        return None if row is None else job_out(row)
