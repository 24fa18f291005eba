"""The background loop that drives video jobs, one per replica.

Every ``TICK_SECONDS`` (or at once when this replica created a job) it claims due jobs
with one atomic UPDATE (``JobStore.claim``): unfinished, ``next_poll_at`` passed, and
nobody holding the lease, or its holder let it run out. The lease lasts
``settings.video_lease_seconds`` and is renewed every third of that while the
replica works on the job, so with any number of replicas exactly one drives a job at
a time. Each claimed job takes one step (``steps.py``); a step that leaves the job
unfinished keeps the lease until ``lease`` past the next poll, and the holder claims
its own jobs again when they fall due: a job is polled by one replica from start to
end. A replica that dies holding a lease hands its jobs over when the leases run out
(at most ``lease`` after their next poll was due); a graceful stop releases its leases
at once. State lives in the database only, so after a restart running jobs simply
resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import socket
import uuid

import structlog

from app.domain.video.steps import JobStepper
from app.domain.video.store import JobStore
from app.lib.clock import utcnow
from app.lib.events.base import EventBus
from app.routing.service import RoutingService

logger = structlog.get_logger()

TICK_SECONDS = 0.5
BATCH = 20
"""Jobs claimed per round; more due ones are claimed in the next round right away."""


def default_replica_id() -> str:
    """``host:pid:random`` (at most 64 characters, the column's size): unique per
    poller, and it tells an operator (or a cluster test) which process holds a lease."""
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class VideoPoller:
    def __init__(
        self,
        *,
        store: JobStore,
        routing: RoutingService,
        bus: EventBus,
        poll_seconds: float,
        timeout_seconds: float,
        lease_seconds: float,
        replica_id: str | None = None,
        tick_seconds: float = TICK_SECONDS,
        batch: int = BATCH,
    ) -> None:
        self.replica_id = replica_id or default_replica_id()
        """This replica's name in ``video_jobs.lease_owner``."""
        self._store = store
        self._lease = datetime.timedelta(seconds=lease_seconds)
        self._tick = tick_seconds
        self._batch = batch
        self._stepper = JobStepper(
            store=store,
            routing=routing,
            bus=bus,
            owner=self.replica_id,
            lease=self._lease,
            poll_seconds=poll_seconds,
            timeout_seconds=timeout_seconds,
        )
        self._woken = asyncio.Event()
        self._active: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._failing = False

    @property
    def task_name(self) -> str:
        """The name of the lifespan task running ``run`` (unique per replica)."""
        return f"video-poller:{self.replica_id}"

    @property
    def stepping(self) -> int:
        """Jobs this replica is taking a step of right now."""
        return len(self._active)

    def wake(self) -> None:
        """Look for due jobs now instead of at the next tick (a job was just created)."""
        self._woken.set()

    async def run(self) -> None:
        """Claim and step due jobs until cancelled (in-flight steps are cancelled too;
        their leases stay until ``close`` or until they run out)."""
        renewer = asyncio.create_task(self._renew())
        try:
            while True:
                room = self._batch - len(self._active)
                if room > 0 and await self._claim_quietly(room) == room:
                    continue  # more may be due: no pause
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._woken.wait(), self._tick)
                self._woken.clear()
        finally:
            renewer.cancel()
            steps = list(self._active.values())
            for step in steps:
                step.cancel()
            await asyncio.gather(renewer, *steps, return_exceptions=True)
            self._active.clear()

    async def _claim_quietly(self, room: int) -> int:
        """``_claim``, but a database that fails is logged (once per outage) and
        retried at the next tick, without disturbing the steps in flight."""
        try:
            claimed = await self._claim(room)
        except Exception as exc:
            if not self._failing:
                logger.warning("could not claim video jobs; retrying", error=repr(exc))
            self._failing = True
            return 0
        if self._failing:
            logger.info("claiming video jobs again")
        self._failing = False
        return claimed

    async def _claim(self, room: int) -> int:
        """Claim up to ``room`` due jobs and start a step for each; returns how many.

        Steps run as tasks of their own: a provider that is slow to answer holds up
        its own job only."""
        now = utcnow()
        jobs = await self._store.claim(
            self.replica_id, now, now + self._lease, room, busy=list(self._active)
        )
        for job in jobs:
            task = asyncio.create_task(self._stepper.step(job))
            self._active[job.id] = task
            task.add_done_callback(self._forget)
        return len(jobs)

    def _forget(self, task: asyncio.Task[None]) -> None:
        for job_id, running in list(self._active.items()):
            if running is task:
                del self._active[job_id]

    async def _renew(self) -> None:
        """Keep the leases of the jobs being stepped (a slow provider call, a stall)."""
        interval = self._lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            held = list(self._active)
            if not held:
                continue
            try:
                await self._store.renew(held, self.replica_id, utcnow() + self._lease)
            except Exception as exc:
                logger.warning("could not renew video job leases", error=repr(exc))

    async def close(self) -> None:
        """Give back the leases this replica holds (after ``run`` was cancelled), so
        another replica, or this one restarted, takes the jobs over without waiting."""
        try:
            await self._store.release_all(self.replica_id)
        except Exception as exc:
            logger.warning("could not release video job leases", error=repr(exc))
