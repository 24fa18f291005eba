"""The dashboard area's life in the app: the record of recent budget alerts, kept
current by following ``budgets.alerts`` (see ``budget_alerts``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import structlog
from redis.asyncio import Redis

from app.domain.dashboard.budget_alerts import AlertHistory, parse_alert
from app.domain.quotas.alerts import CHANNEL as ALERTS_CHANNEL
from app.lib.components import BackgroundTask, Component
from app.lib.events.base import EventBus

logger = structlog.get_logger()

FOLLOW_READY_SECONDS = 2.0


class DashboardWiring(Component):
    name = "dashboard"

    def __init__(self, *, bus: EventBus, redis: Redis | None, redis_prefix: str) -> None:
        self._bus = bus
        self.alerts = AlertHistory(redis, prefix=redis_prefix)
        self.following = asyncio.Event()
        """Set once the subscription is in place."""

    def provides(self) -> Mapping[str, object]:
        return {"budget_alert_log": self.alerts}

    async def start(self) -> None:
        self.following = asyncio.Event()  # a fresh one per run of the app's lifespan

    def tasks(self) -> Sequence[BackgroundTask]:
        return (BackgroundTask("budget-alert-log", self.follow),)

    async def ready(self) -> None:
        # Briefly: an alert raised by this replica's first calls should be on its page.
        # Redis being down must not hold up serving (the task keeps retrying).
        try:
            await asyncio.wait_for(self.following.wait(), FOLLOW_READY_SECONDS)
        except TimeoutError:
            logger.warning("budget alerts are not followed yet; the dashboard may miss some")

    async def follow(self) -> None:
        """Record each alert as it is published. Nothing to reload on (re)subscribing:
        the shared record is the source, and memory only ever holds what was heard."""
        async with self._bus.subscribe(ALERTS_CHANNEL) as events:
            self.following.set()
            async for event in events:
                entry = parse_alert(event)
                if entry is not None:
                    await self.alerts.add(entry)
