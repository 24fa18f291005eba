"""Breaker and cooldown verdicts travel between replicas (two rigs on one store and bus)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest

from app.lib.events.memory import MemoryEventBus
from app.lib.state.memory import MemoryStateStore
from app.routing.breaker import BreakerState
from app.routing.errors import NoHealthyBackendError, UpstreamError
from app.routing.registry import BackendState
from app.routing.shared_verdicts import VERDICT_CHANNEL, SharedVerdicts
from app.routing.types import RawBody, RouteHints
from tests.support.helpers import running, until
from tests.support.routing_fakes import RoutingRig

BODY = msgspec.json.decode(b'{"messages":[{"role":"user","content":"hi"}]}', type=RawBody)


class Replica:
    def __init__(self, name: str, state: MemoryStateStore, events: MemoryEventBus) -> None:
        self.rig = RoutingRig(state, events)
        self.verdicts = SharedVerdicts(
            self.rig.registry,
            self.rig.router,
            state,
            events,
            instance=name,
            wall_clock=self.rig.clock,
        )
        self.verdicts.watch()

    def backend_state(self, name: str) -> BackendState:
        state = self.rig.registry.get(name)
        assert state is not None
        return state


@contextlib.asynccontextmanager
async def following(*replicas: Replica) -> AsyncIterator[None]:
    async with running(*(r.verdicts.run for r in replicas)):
        yield
    for replica in replicas:
        await replica.verdicts.close()


@pytest.fixture
def pair() -> tuple[Replica, Replica]:
    state, events = MemoryStateStore(), MemoryEventBus()
    return Replica("a", state, events), Replica("b", state, events)


async def fail_until_open(replica: Replica, backend: str) -> None:
    replica.rig.script(backend).default = "fail500"
    for _ in range(replica.backend_state(backend).breaker.threshold):
        with pytest.raises(UpstreamError):
            await replica.rig.service.chat("m", BODY, RouteHints())


async def test_a_breaker_opened_on_one_replica_is_honoured_by_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    a.rig.add("x")
    b.rig.add("x")
    async with following(a, b):
        await fail_until_open(a, "x")
        assert a.backend_state("x").breaker.state is BreakerState.OPEN
        await until(lambda: b.backend_state("x").breaker.state is BreakerState.OPEN)
        # B refuses at once, without calling the upstream it never saw fail.
        with pytest.raises(NoHealthyBackendError):
            await b.rig.service.chat("m", BODY, RouteHints())
        assert b.rig.backend("x").calls == []
        # It stays open for the time A's breaker has left, not a fresh full period.
        remaining = b.backend_state("x").breaker.open_remaining()
        assert 0 < remaining <= a.backend_state("x").breaker.open_seconds


async def test_a_trial_that_closes_the_breaker_closes_it_everywhere(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    a.rig.add("x")
    b.rig.add("x")
    async with following(a, b):
        await fail_until_open(a, "x")
        await until(lambda: b.backend_state("x").breaker.state is BreakerState.OPEN)
        for replica in (a, b):
            replica.rig.clock.advance(a.backend_state("x").breaker.open_seconds + 1)
        a.rig.script("x").default = "ok"
        await a.rig.service.chat("m", BODY, RouteHints())
        assert a.backend_state("x").breaker.state is BreakerState.CLOSED
        await until(lambda: b.backend_state("x").breaker.state is BreakerState.CLOSED)


async def test_a_cooldown_started_on_one_replica_steers_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    for replica in (a, b):
        replica.rig.add("x")
        replica.rig.add("y")
    async with following(a, b):
        # One failure on A: below the breaker threshold, but x starts cooling.
        a.rig.script("x").outcomes.append("fail500")
        a.rig.script("y").default = "fail500"
        with contextlib.suppress(UpstreamError):
            await a.rig.service.chat("m", BODY, RouteHints(exclude=frozenset({"y"})))
        assert a.rig.router.is_cooling(a.backend_state("x"))
        await until(lambda: b.rig.router.is_cooling(b.backend_state("x")))
        assert b.backend_state("x").breaker.state is BreakerState.CLOSED
        for _ in range(4):
            outcome = await b.rig.service.chat("m", BODY, RouteHints())
            assert outcome.backend == "y"
        assert b.rig.backend("x").calls == []


async def test_a_backend_loaded_later_takes_over_the_stored_verdict(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    a.rig.add("x")
    async with following(a):
        await fail_until_open(a, "x")
        await a.verdicts.close()  # the verdict is stored
    b.rig.add("x")  # loaded after the breaker opened: no event reaches it
    await until(lambda: b.backend_state("x").breaker.state is BreakerState.OPEN)
    await b.verdicts.close()


async def test_a_verdict_for_another_upstream_under_the_same_name_is_ignored(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    b.rig.add("x")
    async with following(b):
        await a.rig.events.publish(
            VERDICT_CHANNEL,
            {
                "origin": "a",
                "backend": "x",
                "upstream": "http://elsewhere",
                "open_for": 30.0,
                "cooling_for": 30.0,
            },
        )
        await a.rig.events.publish(VERDICT_CHANNEL, {"origin": "a", "backend": "x"})
        await asyncio.sleep(0.05)
        assert b.backend_state("x").breaker.state is BreakerState.CLOSED
        assert not b.rig.router.is_cooling(b.backend_state("x"))


async def test_failures_below_the_threshold_after_the_first_publish_nothing(
    pair: tuple[Replica, Replica],
) -> None:
    a, _ = pair
    a.rig.add("x")
    a.rig.script("x").default = "fail500"
    async with a.rig.events.subscribe(VERDICT_CHANNEL) as events:
        received: list[dict[str, object]] = []

        async def collect() -> None:
            async for event in events:
                received.append(event)

        collector = asyncio.create_task(collect())
        for _ in range(2):
            with pytest.raises(UpstreamError):
                await a.rig.service.chat("m", BODY, RouteHints())
        await a.verdicts.close()
        await asyncio.sleep(0.02)
        collector.cancel()
    # The first failure started the cooldown; the second changed nothing shareable.
    assert len(received) == 1
    assert received[0]["cooling_for"] == a.rig.router.cooldown_seconds
    assert received[0]["open_for"] == 0.0
