"""Leases (``app.domain.quotas.leases``): far from its limits a caller's calls are
admitted from room reserved for several at once, every call still counted as it
ends; near a limit every call reserves alone. On memory and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from app.domain.quotas.errors import QuotaExceededError
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.leases import LEASE_SECONDS, LEASE_SHARE, MAX_LEASE_CALLS, MIN_LEASE_CALLS
from app.lib.state.base import MultiWindowDecision, ReserveWindow, StateStore
from tests.domain import test_quota_reservations as reservations
from tests.domain.test_quota_gate import Limits
from tests.domain.test_quota_reservations import gate_on, reserve, used
from tests.support.state_harness import Harness

# The memory-and-Redis store harness and the limits table of the reservation tests.
harness = reservations.harness
limits = reservations.limits


class CountingStore:
    """A state store that counts the reservations and parts it is asked for."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self.reserves = 0
        self.parts = 0

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        self.reserves += 1
        return await self._store.reserve(windows, hold_id, hold_ttl)

    async def settle_part(self, hold_id: str, parts: Mapping[str, tuple[int, int]]) -> bool:
        self.parts += 1
        return await self._store.settle_part(hold_id, parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def counting(harness: Harness, limits: Limits, **kwargs: object) -> tuple[QuotaGate, CountingStore]:
    store = CountingStore(harness.state())
    return gate_on(cast("StateStore", store), limits, **kwargs), store


async def settled_after_leases_close() -> None:
    await asyncio.sleep(LEASE_SECONDS + 0.15)


async def test_far_from_its_limits_a_caller_reserves_once_per_lease(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(tokens_per_day=10**9, budget_per_month=10**12)
    gate, store = counting(harness, limits)
    for i in range(100):
        hold = await reserve(gate, project_id, tokens=500, cost=1_000)
        assert hold is not None
        await hold.settle(tokens=10 + i, cost_micros=7)
    # The first call alone (it learns the room), then leases of MAX_LEASE_CALLS.
    assert store.reserves <= 1 + 100 // (MAX_LEASE_CALLS - 1) + 1
    counted = await used(gate, limits, project_id)
    # Every call is counted as it ends, leases open or not.
    assert (counted["requests/day"] or 0) >= 100
    await settled_after_leases_close()
    counted = await used(gate, limits, project_id)
    assert counted["requests/day"] == 100
    assert counted["tokens/day"] == sum(10 + i for i in range(100))
    assert counted["cost/month"] == 700  # totals count live holds: none is left


async def test_calls_arriving_together_share_the_lease_being_reserved(
    harness: Harness, limits: Limits
) -> None:
    """At concurrency the calls that arrive while a lease is being reserved wait for it
    rather than each reserving one (a herd of leases would hold room for nothing)."""
    project_id = limits.project(tokens_per_day=10**9)
    gate, store = counting(harness, limits)
    first = await reserve(gate, project_id, tokens=100)  # learns the room
    assert first is not None
    holds = await asyncio.gather(*(reserve(gate, project_id, tokens=100) for _ in range(64)))
    assert store.reserves <= 1 + 64 // MAX_LEASE_CALLS + 1
    await asyncio.gather(*(h.settle(tokens=1, cost_micros=0) for h in holds if h is not None))
    await first.settle(tokens=1, cost_micros=0)
    await settled_after_leases_close()
    counted = await used(gate, limits, project_id)
    assert (counted["requests/day"], counted["tokens/day"]) == (65, 65)


async def test_near_a_limit_every_call_reserves_alone(harness: Harness, limits: Limits) -> None:
    calls_of_room = LEASE_SHARE * MIN_LEASE_CALLS - 1
    project_id = limits.project(tokens_per_day=calls_of_room * 100)
    gate, store = counting(harness, limits)
    for _ in range(10):
        hold = await reserve(gate, project_id, tokens=100)
        assert hold is not None
        await hold.settle(tokens=100, cost_micros=0)
    assert store.reserves == 10
    assert store.parts == 0


async def test_a_call_larger_than_the_leases_rest_reserves_anew(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(tokens_per_day=10**9)
    gate, store = counting(harness, limits)
    first = await reserve(gate, project_id, tokens=100)  # learns the room
    second = await reserve(gate, project_id, tokens=100)  # opens a lease of 32 x 100
    third = await reserve(gate, project_id, tokens=100)  # from the lease
    assert store.reserves == 2
    big = await reserve(gate, project_id, tokens=100 * MAX_LEASE_CALLS)  # does not fit
    assert store.reserves == 3
    for hold, tokens in ((first, 1), (second, 2), (third, 3), (big, 4)):
        assert hold is not None
        await hold.settle(tokens=tokens, cost_micros=0)
    await settled_after_leases_close()
    assert (await used(gate, limits, project_id))["tokens/day"] == 10


async def test_a_leased_call_that_never_ran_counts_nothing(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(tokens_per_day=10**9)
    gate = gate_on(harness.state(), limits)
    for _ in range(2):
        hold = await reserve(gate, project_id, tokens=100)
        assert hold is not None
        await hold.settle(tokens=5, cost_micros=0)
    leased = await reserve(gate, project_id, tokens=100)
    assert leased is not None
    await leased.release()
    await leased.release()  # once only
    await settled_after_leases_close()
    counted = await used(gate, limits, project_id)
    assert (counted["requests/day"], counted["tokens/day"]) == (2, 10)


async def test_a_dead_replicas_lease_keeps_what_its_calls_used(
    harness: Harness, limits: Limits
) -> None:
    """SIGKILLed with a lease open: the calls that ended were counted when they ended;
    the rest (and the calls still running) comes back when its hold expires."""
    project_id = limits.project(tokens_per_day=10**9)
    gate = gate_on(harness.state(), limits, hold_ttl=0.3)
    for tokens in (5, 6):  # the second opens the lease
        hold = await reserve(gate, project_id, tokens=100)
        assert hold is not None
        await hold.settle(tokens=tokens, cost_micros=0)
    running = await reserve(gate, project_id, tokens=100)
    assert running is not None
    gate.hold_keeper.stop()  # the replica died: nothing extends or closes anything
    for lease in list(gate.leases._open.values()):
        assert lease._timer is not None
        lease._timer.cancel()
    await asyncio.sleep(0.5)
    counted = await used(gate, limits, project_id)
    assert (counted["requests/day"], counted["tokens/day"]) == (2, 11)


async def test_three_replicas_with_leases_never_admit_past_a_limit(
    harness: Harness, limits: Limits
) -> None:
    """Room for 1,000 calls, 1,500 sent over three replicas: leases are taken while
    the room is large; none admits past the limit, and what leases hold unused when the
    limit is reached is at most a few calls per replica."""
    project_id = limits.project(tokens_per_day=1_000 * 10)
    gates = [gate_on(harness.state(), limits) for _ in range(3)]
    slots = [asyncio.Semaphore(16) for _ in gates]

    async def call(i: int) -> str:
        async with slots[i % 3]:
            try:
                hold = await reserve(gates[i % 3], project_id, tokens=10)
            except QuotaExceededError as exc:
                return exc.code
            assert hold is not None
            await asyncio.sleep(0.002)
            await hold.settle(tokens=10, cost_micros=0)
            return "admitted"

    results = await asyncio.gather(*(call(i) for i in range(1_500)))
    admitted = results.count("admitted")
    stranded = 3 * (1_000 // LEASE_SHARE)
    assert 1_000 - stranded <= admitted <= 1_000
    assert results.count("token_limit_exceeded") == 1_500 - admitted
    await settled_after_leases_close()
    assert (await used(gates[0], limits, project_id))["tokens/day"] == admitted * 10
    # What was left unused comes back: the window fills up exactly.
    for _ in range(1_000 - admitted):
        hold = await reserve(gates[1], project_id, tokens=10)
        assert hold is not None
        await hold.settle(tokens=10, cost_micros=0)
    with pytest.raises(QuotaExceededError):
        await reserve(gates[2], project_id, tokens=10)
