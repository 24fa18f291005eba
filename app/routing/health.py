"""Background health probing of every registered backend.

A backend is fail-closed until its first probe; the prober runs one at once when a
backend is added or replaced, then every ``interval`` seconds for all backends,
reading the registry afresh each round. Status changes are published on the
``EventBus`` so dashboards (on any replica) can show them live.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from app.lib.events.base import EventBus
from app.routing.registry import BackendRegistry, BackendState
from app.routing.types import Health, HealthStatus

HEALTH_CHANNEL = "routing.health"
DEFAULT_INTERVAL_SECONDS = 60.0

logger = structlog.get_logger()


class HealthChecker:
    def __init__(
        self,
        registry: BackendRegistry,
        events: EventBus,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._events = events
        self.interval = interval
        self._wall_clock = wall_clock
        self._pending: set[asyncio.Task[Health]] = set()

    def watch(self) -> None:
        """Probe every backend as soon as it is added or replaced."""
        self._registry.on_added(self.schedule)

    def schedule(self, state: BackendState) -> None:
        task = asyncio.get_running_loop().create_task(self.probe(state))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def probe(self, state: BackendState) -> Health:
        result = await state.adapter.probe()
        status = HealthStatus.HEALTHY if result.healthy else HealthStatus.UNHEALTHY
        health = Health(status, result.reason, self._wall_clock())
        if not self._registry.is_current(state):
            return health  # replaced or removed while probing: the result is stale
        previous = state.health
        state.apply_probe(result, health)
        if previous.status is not status or previous.reason != health.reason:
            if previous.status is not status:
                logger.info(
                    "backend health changed",
                    backend=state.name,
                    status=status.value,
                    reason=health.reason,
                )
            await self._publish(state, previous, health)
        return health

    async def probe_all(self) -> None:
        states = list(self._registry)
        if states:
            await asyncio.gather(*(self.probe(state) for state in states))

    async def run(self) -> None:
        """Probe every backend each interval; the first round comes one interval after
        start, since ``watch`` already probes each backend as it is loaded."""
        while True:
            await asyncio.sleep(self.interval)
            await self.probe_all()

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _publish(self, state: BackendState, previous: Health, health: Health) -> None:
        try:
            await self._events.publish(
                HEALTH_CHANNEL,
                {
                    "backend": state.name,
                    "kind": state.kind,
                    "status": health.status.value,
                    "previous": previous.status.value,
                    "reason": health.reason,
                    "checked_at": health.checked_at,
                },
            )
        except Exception as exc:  # the bus is a hint channel; probing must go on
            logger.warning("could not publish health change", error=repr(exc))
