"""The video area's life in the app: jobs and prices provided, the poller run in the
background and its leases given back at shutdown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.calls.admission import CallAdmission
from app.domain.usage.entry import UsageSink
from app.domain.video.setup import build_video
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
        self.jobs, self.poller, self.prices = build_video(
            settings, engine=engine, routing=routing, admission=admission, usage=usage, bus=bus
        )

    def provides(self) -> Mapping[str, object]:
        return {"video_jobs": self.jobs, "video_prices": self.prices}

    def tasks(self) -> Sequence[BackgroundTask]:
        # Claims due video jobs (leases in the database) and drives them.
        return (BackgroundTask("video-poller", self.poller.run, task_name=self.poller.task_name),)

    async def aclose(self) -> None:
        # Before the engine goes: the jobs this replica held are due elsewhere at once.
        await self.poller.close()
