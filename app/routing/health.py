"""Background health probing of every registered backend, once per interval cluster-wide.

A backend is fail-closed until its first probe; each replica probes a backend at once
when it is added or replaced (so it can route to it without waiting for a round).
After that probing goes in rounds aligned to the wall clock (round ``n`` starts at
``n * interval`` seconds since the epoch). Every replica wakes for each round, and the
first to claim the round's key in the ``StateStore`` (``set_if_absent`` with a TTL)
probes every backend; the others skip it. So a backend is probed once per interval
however many replicas run, and when the replica that probed dies the next round is
simply claimed by another: takeover within one interval, with no lease to hand over.

The prober publishes every round's results on ``routing.probes`` (discovered models
included) and every replica applies them as if it had probed itself; status changes
also go to ``routing.health``, once, from the replica that saw them, for dashboards.
When the store cannot be reached (Redis down), each replica probes for itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from app.lib.events.base import EventBus
from app.lib.state.base import StateStore
from app.lib.state.memory import MemoryStateStore
from app.routing.registry import BackendRegistry, BackendState
from app.routing.replicas import tell_others
from app.routing.types import Health, HealthStatus, ProbeResult

HEALTH_CHANNEL = "routing.health"
PROBES_CHANNEL = "routing.probes"
DEFAULT_INTERVAL_SECONDS = 60.0

logger = structlog.get_logger()


class HealthChecker:
    def __init__(
        self,
        registry: BackendRegistry,
        events: EventBus,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        store: StateStore | None = None,
        instance: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._registry = registry
        self._events = events
        self.interval = interval
        # Not ``store or ...``: an empty MemoryStateStore is falsy (it has a length).
        self._store = MemoryStateStore() if store is None else store
        self.instance = instance or uuid.uuid4().hex
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._pending: set[asyncio.Task[Health]] = set()
        self.rounds_probed = 0
        """Rounds this replica claimed and probed (the others were probed elsewhere)."""

    def watch(self) -> None:
        """Probe every backend as soon as it is added or replaced."""
        self._registry.on_added(self.schedule)

    def schedule(self, state: BackendState, *, share: bool = False) -> None:
        """Probe ``state`` in the background (``probe``)."""
        task = asyncio.get_running_loop().create_task(self.probe(state, share=share))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def probe(self, state: BackendState, *, share: bool = False) -> Health:
        """Probe one backend now. ``share``: the other replicas apply the result too, as
        they do a round's (a probe an admin asked for must not leave them on stale
        health until the next round); a backend's first probe after it was added or
        replaced is not shared, since every replica makes its own."""
        result = await state.adapter.probe()
        change = self._apply(state, result)
        if change is not None:
            await self._announce(state, *change)
            if share:
                await self._share([_shared(state, result)])
            return change[1]
        # Replaced or removed while probing: the result is stale.
        return Health(_status(result), result.reason, self._wall_clock())

    def _apply(self, state: BackendState, result: ProbeResult) -> tuple[Health, Health] | None:
        """Apply ``result`` to ``state`` if it is still current: (previous, new) health."""
        if not self._registry.is_current(state):
            return None
        previous = state.health
        health = Health(_status(result), result.reason, self._wall_clock())
        state.apply_probe(result, health)
        return previous, health

    async def _announce(self, state: BackendState, previous: Health, health: Health) -> None:
        if previous.status is not health.status or previous.reason != health.reason:
            if previous.status is not health.status:
                _log_change(state, health)
            await self._publish(state, previous, health)

    async def probe_all(self) -> None:
        """Probe every backend and share the results with the other replicas."""
        states = list(self._registry)
        if not states:
            return
        results = await asyncio.gather(*(s.adapter.probe() for s in states))
        shared: list[dict[str, Any]] = []
        for state, result in zip(states, results, strict=True):
            change = self._apply(state, result)
            if change is None:
                continue
            await self._announce(state, *change)
            shared.append(_shared(state, result))
        await self._share(shared)

    async def _share(self, results: list[dict[str, Any]]) -> None:
        try:
            await tell_others(self._events, PROBES_CHANNEL, self.instance, results=results)
        except Exception as exc:  # the others probe for themselves once rounds go unclaimed
            logger.warning("could not share probe results", error=repr(exc))

    async def run(self) -> None:
        """Claim and probe the rounds nobody else claimed. The first round comes at the
        next interval boundary, since ``watch`` already probes each backend as it loads."""
        while True:
            now = self._wall_clock()
            round_no = int(now // self.interval) + 1
            await self._sleep(round_no * self.interval - now)
            await self.run_round(round_no)

    async def run_round(self, round_no: int) -> bool:
        """Probe round ``round_no`` unless another replica claimed it; True if probed."""
        if not await self._claim(round_no):
            return False
        self.rounds_probed += 1
        await self.probe_all()
        return True

    async def _claim(self, round_no: int) -> bool:
        try:
            return await self._store.set_if_absent(
                f"health:round:{round_no}", self.instance.encode(), ttl=2 * self.interval
            )
        except Exception as exc:
            # No shared store: better every replica probes than none does.
            logger.warning("could not claim a probe round; probing here", error=repr(exc))
            return True

    async def follow(self) -> None:
        """Apply the rounds other replicas probe (run supervised)."""
        async with self._events.subscribe(PROBES_CHANNEL) as events:
            async for event in events:
                if event.get("origin") != self.instance:
                    await self._apply_shared(event.get("results"))

    async def _apply_shared(self, results: object) -> None:
        if not isinstance(results, list):
            logger.warning("malformed probe results", results=results)
            return
        for item in results:
            try:
                name = str(item["backend"])
                upstream = str(item["upstream"])
                result = ProbeResult(
                    bool(item["healthy"]),
                    str(item["reason"]),
                    tuple(str(m) for m in item["models"]),
                )
            except (KeyError, TypeError, ValueError):
                logger.warning("malformed probe result", result=item)
                continue
            state = self._registry.get(name)
            if state is None or state.upstream != upstream:
                continue  # not loaded here yet, or a different upstream under that name
            change = self._apply(state, result)
            if change is not None:
                # The prober told the dashboards; this replica only logs.
                previous, health = change
                if previous.status is not health.status:
                    _log_change(state, health, probed_elsewhere=True)

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


def _shared(state: BackendState, result: ProbeResult) -> dict[str, Any]:
    """One probe result as the other replicas apply it (``_apply_shared``)."""
    return {
        "backend": state.name,
        "upstream": state.upstream,
        "healthy": result.healthy,
        "reason": result.reason,
        "models": list(result.models),
    }


def _status(result: ProbeResult) -> HealthStatus:
    return HealthStatus.HEALTHY if result.healthy else HealthStatus.UNHEALTHY


def _log_change(state: BackendState, health: Health, **fields: object) -> None:
    logger.info(
        "backend health changed",
        backend=state.name,
        status=health.status.value,
        reason=health.reason,
        **fields,
    )
