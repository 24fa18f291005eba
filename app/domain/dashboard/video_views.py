"""What the video jobs page shows, and its live feed (``/admin/stream/video``).

The table holds the newest ``RECENT_JOBS`` jobs of every project (and of users
without one), read through the video store. The feed follows the ``video.jobs``
channel, on which whichever replica changed a job publishes, and re-renders the
table on each event (only when its HTML changed); a timer re-reads it too, so a job
whose event was lost still catches up. Fragments:

- ``video-jobs``: the rows (project, model, backend, status, progress, cost, error,
  created, and a Cancel button while the job is active), on connect and whenever the
  set of jobs shown changes (a new job);
- ``video-<job id>-<cell>``: one live cell of a job's row (``LIVE_CELLS``), when its
  content changed; the row and its Cancel button are not replaced meanwhile, so a
  click (and its confirmation dialog) is never lost to a progress update. Cells are
  held back for ``SETTLE_SECONDS`` after new rows went out: htmx starts listening to
  new cells only once their swap has settled, and a cell sent before that is lost;
- ``video-clock``: the time of the last update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from app.db.models import VideoJob
from app.domain.dashboard.feeds import Render
from app.domain.dashboard.stream import Fragment, SentCache
from app.domain.projects.services import ProjectService
from app.domain.video.events import CHANNEL as VIDEO_CHANNEL
from app.domain.video.facade import VideoJobs
from app.domain.video.store import ACTIVE
from app.domain.video.views import public_id
from app.lib.clock import utcnow
from app.lib.events.base import Event

ROWS_TEMPLATE = "dashboard/partials/video_rows.html"
CELL_TEMPLATE = "dashboard/partials/video_cell.html"
LIVE_CELLS = ("backend", "status", "progress", "cost", "error", "actions")
CLOCK_TEMPLATE = "dashboard/partials/clock.html"
RECENT_JOBS = 100
TICK_SECONDS = 2.0
SETTLE_SECONDS = 0.25
"""Cells are held back this long after new rows went out (see ``VideoFeed``)."""
NO_PROJECT = "(no project)"
DELETED_PROJECT = "(deleted project)"


@dataclass(frozen=True, slots=True)
class JobView:
    job: VideoJob
    project_name: str

    @property
    def id(self) -> str:
        return public_id(self.job.id)

    @property
    def active(self) -> bool:
        return self.job.status in ACTIVE

    @property
    def tone(self) -> str:
        return {"done": "ok", "failed": "bad", "cancelled": "muted"}.get(self.job.status, "warn")


@dataclass(frozen=True, slots=True)
class VideoJobsView:
    jobs: list[JobView]
    total: int


async def video_jobs_view(jobs: VideoJobs, limit: int = RECENT_JOBS) -> VideoJobsView:
    """The newest jobs across every owner, with their project's name."""
    rows, total = await jobs.store.page(None, limit, 0)
    ids: set[UUID] = {row.project_id for row in rows if row.project_id is not None}
    names: dict[UUID, str] = {}
    if ids:
        async with jobs.store.session() as session:
            names = await ProjectService(session=session).names_of(ids)
    views = [
        JobView(
            row,
            NO_PROJECT if row.project_id is None else names.get(row.project_id, DELETED_PROJECT),
        )
        for row in rows
    ]
    return VideoJobsView(jobs=views, total=total)


def cell_event(job_id: str, cell: str) -> str:
    return f"video-{job_id}-{cell}"


class VideoFeed:
    channels: tuple[str, ...] = (VIDEO_CHANNEL,)
    tick_seconds = TICK_SECONDS

    def __init__(
        self, *, jobs: VideoJobs, render: Render, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._jobs = jobs
        self._render = render
        self._sent = SentCache()
        self._shown: list[str] = []
        self._clock = clock
        self._rows_sent_at = -SETTLE_SECONDS

    def _cells(self, view: VideoJobsView) -> list[Fragment]:
        return [
            (cell_event(j.id, cell), self._render(CELL_TEMPLATE, {"j": j, "cell": cell}))
            for j in view.jobs
            for cell in LIVE_CELLS
        ]

    async def _update(self, *, whole: bool) -> list[Fragment]:
        view = await video_jobs_view(self._jobs)
        shown = [j.id for j in view.jobs]
        cells = self._cells(view)
        if whole or shown != self._shown:
            # The rows carry their cells: what they show now is what was sent.
            self._shown = shown
            self._sent.record(cells)
            self._rows_sent_at = self._clock()
            return [("video-jobs", self._render(ROWS_TEMPLATE, {"view": view}))]
        if self._clock() - self._rows_sent_at < SETTLE_SECONDS:
            # htmx listens to the new rows' cells only once their swap has settled: a
            # cell sent before that would be lost. Kept back (not recorded as sent), it
            # goes with the next event or tick.
            return []
        return self._sent.changed(cells)

    def _clock_fragment(self) -> Fragment:
        return "video-clock", self._render(CLOCK_TEMPLATE, {"now": utcnow()})

    async def snapshot(self) -> list[Fragment]:
        return [*await self._update(whole=True), self._clock_fragment()]

    async def on_event(self, event: Event) -> list[Fragment]:
        changed = await self._update(whole=False)
        return [*changed, self._clock_fragment()] if changed else []

    async def on_tick(self) -> list[Fragment]:
        return [*await self._update(whole=False), self._clock_fragment()]
