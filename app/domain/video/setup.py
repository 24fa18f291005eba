"""The video area's per-app objects, built once with the other resources."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.calls.admission import CallAdmission
from app.domain.calls.metering import Meter
from app.domain.usage.entry import UsageSink
from app.domain.video.facade import VideoJobs
from app.domain.video.poller import TICK_SECONDS, VideoPoller
from app.domain.video.prices import VideoPrices
from app.domain.video.store import JobStore
from app.lib.events.base import EventBus
from app.lib.settings import Settings
from app.routing.service import RoutingService


def build_video(
    settings: Settings,
    *,
    engine: AsyncEngine,
    routing: RoutingService,
    admission: CallAdmission,
    usage: UsageSink,
    bus: EventBus,
) -> tuple[VideoJobs, VideoPoller, VideoPrices]:
    store = JobStore(engine)
    poller = VideoPoller(
        store=store,
        routing=routing,
        bus=bus,
        poll_seconds=settings.video_poll_seconds,
        timeout_seconds=settings.video_timeout_seconds,
        lease_seconds=settings.video_lease_seconds,
        # Never look for due jobs less often than jobs are polled.
        tick_seconds=min(TICK_SECONDS, settings.video_poll_seconds),
    )
    jobs = VideoJobs(
        store=store,
        router=routing.router,
        admission=admission,
        meter=Meter(usage, routing.clock),
        bus=bus,
        wake=poller.wake,
    )
    return jobs, poller, VideoPrices(engine)
