"""Breaker and cooldown verdicts shared by every replica.

Each replica keeps its own ``CircuitBreaker`` and cooldown per backend (routing reads
them on every request and must not wait on Redis), and the replicas tell each other
when one changes: a breaker that opens or closes, a backend that starts cooling. The
verdict is published on the ``EventBus`` for the replicas running now and written to
the ``StateStore`` (with a TTL of the time it still holds) for the ones that start or
load the backend later. A replica applies another's verdict as if it had counted the
failures itself: the breaker trips for the time left, the cooldown runs to the same end.

Only state transitions travel (closed -> open, open or half-open -> closed, warm ->
cooling), so a failing backend costs one event per transition, not one per request.
Events are hints: a lost one leaves a replica to find the fault by itself, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import msgspec
import structlog

from app.lib.events.base import Event, EventBus
from app.lib.state.base import StateStore
from app.routing.breaker import BreakerState
from app.routing.registry import BackendRegistry, BackendState
from app.routing.replicas import follow_others, tell_others
from app.routing.router import Router

VERDICT_CHANNEL = "routing.verdicts"

logger = structlog.get_logger()


class _StoredVerdict(msgspec.Struct, frozen=True):
    upstream: str
    open_until: float
    """Wall-clock epoch seconds; 0 when the breaker is not open."""
    cooling_until: float


@dataclass(slots=True, eq=False)
class SharedVerdicts:
    registry: BackendRegistry
    router: Router
    store: StateStore
    events: EventBus
    _: KW_ONLY
    instance: str
    wall_clock: Callable[[], float] = time.time
    _pending: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def watch(self) -> None:
        """Share this replica's transitions and restore verdicts for backends as they
        load."""
        self.router.on_verdict(self._changed)
        self.registry.on_added(self._schedule_restore)

    # -- outgoing ---------------------------------------------------------------------

    def _changed(self, state: BackendState) -> None:
        self._spawn(self._share(state))

    async def _share(self, state: BackendState) -> None:
        open_for = state.breaker.open_remaining()
        cooling_for = self.router.cooling_remaining(state)
        now = self.wall_clock()
        key = _key(state.name)
        try:
            ttl = max(open_for, cooling_for)
            if ttl > 0:
                stored = _StoredVerdict(state.upstream, now + open_for, now + cooling_for)
                await self.store.set(key, msgspec.json.encode(stored), ttl=ttl)
            else:
                await self.store.delete(key)
        except Exception as exc:  # Redis down: the event below may still get through
            logger.warning("could not store backend verdict", backend=state.name, error=repr(exc))
        await tell_others(
            self.events,
            VERDICT_CHANNEL,
            self.instance,
            backend=state.name,
            upstream=state.upstream,
            open_for=open_for,
            cooling_for=cooling_for,
        )

    # -- incoming ---------------------------------------------------------------------

    async def run(self) -> None:
        """Apply the verdicts other replicas publish (run supervised; on a broken
        subscription it returns by raising, and the restart re-reads the stored ones)."""
        await follow_others(
            self.events,
            VERDICT_CHANNEL,
            self.instance,
            self._apply_event,
            subscribed=self.restore_all,
        )

    def _apply_event(self, event: Event) -> None:
        try:
            name = str(event["backend"])
            upstream = str(event["upstream"])
            open_for = float(event["open_for"])
            cooling_for = float(event["cooling_for"])
        except (KeyError, TypeError, ValueError):
            logger.warning("malformed backend verdict", verdict=event)
            return
        state = self.registry.get(name)
        if state is not None and state.upstream == upstream:
            self._apply(state, open_for, cooling_for)

    def _apply(self, state: BackendState, open_for: float, cooling_for: float) -> None:
        breaker = state.breaker
        if open_for > 0:
            breaker.trip(open_for)
        elif breaker.state is not BreakerState.CLOSED:
            breaker.record_success()
        self.router.cool_for(state, cooling_for)

    async def restore_all(self) -> None:
        for state in self.registry:
            await self.restore(state)

    async def restore(self, state: BackendState) -> None:
        """Take over a verdict stored by another replica (a backend loaded after it
        opened, or a replica that missed the event)."""
        try:
            raw = await self.store.get(_key(state.name))
        except Exception as exc:
            logger.warning("could not read backend verdict", backend=state.name, error=repr(exc))
            return
        if raw is None or not self.registry.is_current(state):
            return
        try:
            stored = msgspec.json.decode(raw, type=_StoredVerdict)
        except msgspec.DecodeError:
            return
        if stored.upstream != state.upstream:
            return
        now = self.wall_clock()
        open_for = max(0.0, stored.open_until - now)
        cooling_for = max(0.0, stored.cooling_until - now)
        if open_for > 0 or cooling_for > 0:
            self._apply(state, open_for, cooling_for)

    def _schedule_restore(self, state: BackendState) -> None:
        self._spawn(self.restore(state))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no loop (a synchronous test of the router): nothing to share
            work.close()
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        """Let the verdicts being shared go out (a replica stopping after a failure
        should not leave the others to find it again)."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=2.0)
        for task in list(self._pending):
            task.cancel()


def _key(backend: str) -> str:
    return f"verdict:{backend}"
