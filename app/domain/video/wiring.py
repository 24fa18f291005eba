"""The video area's life in the app: its per-app objects built once with the other
resources, jobs and prices provided, the poller run in the background and its leases
given back at shutdown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.calls.admission import CallAdmission
from app.domain.calls.metering import Meter
from app.domain.usage.entry import UsageSink
from app.domain.video.facade import VideoJobs
from app.domain.video.poller import TICK_SECONDS, VideoPoller
from app.domain.video.prices import VideoPrices
from app.domain.video.store import JobStore
from app.lib.components import BackgroundTask, Component
from app.lib.events.base import EventBus
from app.lib.settings import Settings
from app.routing.service import RoutingService


class VideoWiring(Component):
    name = "video"

    def __init__(
        self,
        settings: Settings,
        *,
        engine: AsyncEngine,
        routing: RoutingService,
        admission: CallAdmission,
        usage: UsageSink,
        bus: EventBus,
    ) -> None:
        store = JobStore(engine)
        self.poller = VideoPoller(
            store=store,
            routing=routing,
            bus=bus,
            poll_seconds=settings.video_poll_seconds,
            timeout_seconds=settings.video_timeout_seconds,
            lease_seconds=settings.video_lease_seconds,
            # Never look for due jobs less often than jobs are polled.
            tick_seconds=min(TICK_SECONDS, settings.video_poll_seconds),
        )
        self.jobs = VideoJobs(
            store=store,
            router=routing.router,
            admission=admission,
            meter=Meter(usage, routing.clock),
            bus=bus,
            wake=self.poller.wake,
        )
        self.prices = VideoPrices(engine)

    def provides(self) -> Mapping[str, object]:
        return {"video_jobs": self.jobs, "video_prices": self.prices}

    def tasks(self) -> Sequence[BackgroundTask]:
        # Claims due video jobs (leases in the database) and drives them.
        return (BackgroundTask("video-poller", self.poller.run, task_name=self.poller.task_name),)

    async def aclose(self) -> None:
        # Before the engine goes: the jobs this replica held are due elsewhere at once.
        await self.poller.close()
