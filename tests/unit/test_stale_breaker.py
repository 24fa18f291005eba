"""A half-open breaker whose trial never reported back is closed by a good probe, so a
healthy backend does not stay out of rotation while calls pile up elsewhere."""

from __future__ import annotations

from app.routing.breaker import BreakerState, CircuitBreaker
from app.routing.health import HealthChecker
from app.routing.types import RouteHints
from tests.support.routing_fakes import RoutingRig


def state_of(breaker: CircuitBreaker) -> BreakerState:
    return breaker.state  # read afresh (not narrowed by an earlier assert)


async def test_a_good_probe_closes_a_half_open_breaker_whose_trial_is_stuck() -> None:
    rig = RoutingRig()
    state = rig.add("x")
    rig.add("y")
    checker = HealthChecker(rig.registry, rig.events)
    for _ in range(state.breaker.threshold):
        state.breaker.record_failure()
    rig.clock.advance(state.breaker.open_seconds + 1)
    assert state.breaker.acquire()  # the trial went out, and never came back
    assert state.breaker.state is BreakerState.HALF_OPEN
    assert not state.breaker.can_accept()
    picks = {(await rig.router.select("m", "chat", RouteHints())).state.name for _ in range(4)}
    assert picks == {"y"}  # x is out of rotation

    await checker.probe(state)

    assert state_of(state.breaker) is BreakerState.CLOSED
    assert state.breaker.can_accept()
    picks = {(await rig.router.select("m", "chat", RouteHints())).state.name for _ in range(6)}
    assert picks == {"x", "y"}


async def test_a_good_probe_leaves_an_open_breakers_period_alone() -> None:
    rig = RoutingRig()
    state = rig.add("x")
    checker = HealthChecker(rig.registry, rig.events)
    for _ in range(state.breaker.threshold):
        state.breaker.record_failure()
    await checker.probe(state)  # the listing answers; the calls were what failed
    assert state.breaker.state is BreakerState.OPEN


async def test_a_failed_probe_does_not_close_it() -> None:
    rig = RoutingRig()
    state = rig.add("x")
    rig.script("x").probe_healthy = False
    checker = HealthChecker(rig.registry, rig.events)
    for _ in range(state.breaker.threshold):
        state.breaker.record_failure()
    rig.clock.advance(state.breaker.open_seconds + 1)
    assert state.breaker.acquire()
    await checker.probe(state)
    assert state.breaker.state is BreakerState.HALF_OPEN
    assert not state.breaker.can_accept()
