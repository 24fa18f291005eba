from __future__ import annotations

from app.routing.breaker import BreakerState, CircuitBreaker
from tests.support.routing_fakes import FakeClock


def state_of(breaker: CircuitBreaker) -> BreakerState:
    # A call, not the property: mypy would narrow the property across statements.
    return breaker.state


def make() -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(threshold=3, open_seconds=30, clock=clock), clock


def test_three_consecutive_failures_open_it() -> None:
    breaker, _ = make()
    breaker.record_failure()
    breaker.record_failure()
    assert state_of(breaker) is BreakerState.CLOSED
    assert breaker.can_accept()
    breaker.record_failure()
    assert state_of(breaker) is BreakerState.OPEN
    assert not breaker.can_accept()
    assert not breaker.acquire()


def test_a_success_resets_the_count() -> None:
    breaker, _ = make()
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    breaker.record_failure()
    assert state_of(breaker) is BreakerState.CLOSED


def test_half_open_after_30s_admits_exactly_one_trial() -> None:
    breaker, clock = make()
    for _ in range(3):
        breaker.record_failure()
    clock.advance(29.9)
    assert state_of(breaker) is BreakerState.OPEN
    clock.advance(0.1)
    assert state_of(breaker) is BreakerState.HALF_OPEN
    assert breaker.can_accept()
    assert breaker.acquire()
    assert not breaker.can_accept()
    assert not breaker.acquire()


def test_trial_success_closes() -> None:
    breaker, clock = make()
    for _ in range(3):
        breaker.record_failure()
    clock.advance(30)
    assert breaker.acquire()
    breaker.record_success()
    assert state_of(breaker) is BreakerState.CLOSED
    assert breaker.acquire()
    assert breaker.acquire()


def test_trial_failure_reopens_for_another_period() -> None:
    breaker, clock = make()
    for _ in range(3):
        breaker.record_failure()
    clock.advance(30)
    assert breaker.acquire()
    breaker.record_failure()
    assert state_of(breaker) is BreakerState.OPEN
    clock.advance(29)
    assert not breaker.can_accept()
    clock.advance(1)
    assert breaker.acquire()


def test_released_trial_can_be_taken_again() -> None:
    breaker, clock = make()
    for _ in range(3):
        breaker.record_failure()
    clock.advance(30)
    assert breaker.acquire()
    breaker.release()
    assert breaker.acquire()
