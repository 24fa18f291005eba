"""Probe rounds: one replica probes each round, every replica applies the results."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from app.lib.events.memory import MemoryEventBus
from app.lib.state.memory import MemoryStateStore
from app.routing.health import HEALTH_CHANNEL, PROBES_CHANNEL, HealthChecker
from app.routing.types import HealthStatus
from tests.support.helpers import running, until
from tests.support.routing_fakes import RoutingRig


class BrokenStore(MemoryStateStore):
    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        raise ConnectionError("redis is down")


def checker(rig: RoutingRig, name: str, store: MemoryStateStore) -> HealthChecker:
    return HealthChecker(rig.registry, rig.events, interval=1.0, store=store, instance=name)


def following(*checkers: HealthChecker) -> contextlib.AbstractAsyncContextManager[None]:
    return running(*(c.follow for c in checkers))


@pytest.fixture
def replicas() -> list[tuple[RoutingRig, HealthChecker]]:
    store, events = MemoryStateStore(), MemoryEventBus()
    out = []
    for name in ("a", "b", "c"):
        rig = RoutingRig(store, events)
        rig.add("x", models=("static",), healthy=False)
        out.append((rig, checker(rig, name, store)))
    return out


async def test_each_round_is_probed_by_exactly_one_replica(
    replicas: list[tuple[RoutingRig, HealthChecker]],
) -> None:
    for round_no in range(1, 6):
        claimed = await asyncio.gather(*(c.run_round(round_no) for _, c in replicas))
        assert sum(claimed) == 1
    assert sum(rig.backend("x").probes for rig, _ in replicas) == 5
    # The same round asked again (a replica whose clock lags) is not probed twice.
    assert not any(await asyncio.gather(*(c.run_round(5) for _, c in replicas)))


async def test_the_others_apply_the_probers_results_including_discovered_models(
    replicas: list[tuple[RoutingRig, HealthChecker]],
) -> None:
    (rig_a, a), (rig_b, b), (rig_c, c) = replicas
    rig_a.script("x").probe_models = ("found",)
    async with following(a, b, c):
        assert await a.run_round(1)
        for rig in (rig_b, rig_c):
            state = rig.registry.get("x")
            assert state is not None
            await until(lambda s=state: s.health.status is HealthStatus.HEALTHY)  # type: ignore[misc]
            assert state.models == ("static", "found")
            assert rig.backend("x").probes == 0
        rig_a.script("x").probe_healthy = False
        async with rig_a.events.subscribe(HEALTH_CHANNEL) as changes:
            assert await a.run_round(2)
            change = await anext(changes)
        assert change["status"] == "unhealthy"
        state_c = rig_c.registry.get("x")
        assert state_c is not None
        await until(lambda: state_c.health.status is HealthStatus.UNHEALTHY)
        assert state_c.health.reason == "connection refused"


async def test_only_the_prober_announces_a_health_change(
    replicas: list[tuple[RoutingRig, HealthChecker]],
) -> None:
    (rig_a, a), _, _ = replicas
    async with (
        following(*(c for _, c in replicas)),
        rig_a.events.subscribe(HEALTH_CHANNEL) as changes,
    ):
        assert await a.run_round(1)
        first = await anext(changes)
        assert first["status"] == "healthy"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(changes), 0.1)


async def test_a_replica_that_dies_is_replaced_by_the_next_round(
    replicas: list[tuple[RoutingRig, HealthChecker]],
) -> None:
    (_, a), (rig_b, b), _ = replicas
    assert await a.run_round(1)
    # A is gone: nothing renews anything, the next round is simply claimed by B.
    assert await b.run_round(2)
    assert rig_b.backend("x").probes == 1


async def test_results_for_another_upstream_under_the_same_name_are_ignored(
    replicas: list[tuple[RoutingRig, HealthChecker]],
) -> None:
    (rig_a, _), (rig_b, b), _ = replicas
    async with following(b):
        await rig_a.events.publish(
            PROBES_CHANNEL,
            {
                "origin": "a",
                "results": [
                    {
                        "backend": "x",
                        "upstream": "http://elsewhere",
                        "healthy": True,
                        "reason": "ok",
                        "models": ["m2"],
                    },
                    {"backend": "x"},
                ],
            },
        )
        await rig_a.events.publish(PROBES_CHANNEL, {"origin": "a", "results": "nonsense"})
        await asyncio.sleep(0.05)
    state = rig_b.registry.get("x")
    assert state is not None
    assert state.health.status is HealthStatus.UNKNOWN


async def test_without_a_reachable_store_every_replica_probes_for_itself() -> None:
    store = BrokenStore()
    rigs = [RoutingRig(store, MemoryEventBus()) for _ in range(2)]
    for rig in rigs:
        rig.add("x", healthy=False)
    checkers = [checker(rig, name, store) for rig, name in zip(rigs, "ab", strict=True)]
    assert all(await asyncio.gather(*(c.run_round(1) for c in checkers)))
    assert [rig.backend("x").probes for rig in rigs] == [1, 1]


async def test_run_waits_for_the_round_boundary_then_probes() -> None:
    rig = RoutingRig()
    rig.add("x", healthy=False)
    now = [10.25]
    slept: list[float] = []
    stop = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
        if len(slept) > 2:
            stop.set()
            await asyncio.Event().wait()

    health = HealthChecker(
        rig.registry, rig.events, interval=1.0, wall_clock=lambda: now[0], sleep=sleep
    )
    task = asyncio.create_task(health.run())
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert slept[:2] == [pytest.approx(0.75), pytest.approx(1.0)]
    assert health.rounds_probed == 2
