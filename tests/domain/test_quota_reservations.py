"""Token limits and money budgets: ``QuotaGate.reserve`` and the ``Hold`` it returns,
on the memory store and on real Redis (several gates on one Redis are replicas)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import pytest
from prometheus_client import CollectorRegistry

from app.domain.calls.metering import CallRecord, Meter
from app.domain.quotas.alerts import CHANNEL, BudgetAlert, BudgetAlerts
from app.domain.quotas.gate import (
    CallEstimate,
    KeyLimits,
    QuotaExceededError,
    QuotaGate,
    QuotaUnavailableError,
)
from app.domain.quotas.holds import CallHold
from app.domain.quotas.limits import QuotaLimitsCache
from app.lib.events.memory import MemoryEventBus
from app.lib.state.base import StateStore
from app.lib.state.redis import RedisStateStore
from app.routing.types import Usage
from tests.domain.test_quota_gate import CLOSED_PORT_URL, FakeClock, Limits
from tests.support.state_harness import Harness

LONG_HOLD = 60.0


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = Harness(request.param)
    yield h
    await h.cleanup()


@pytest.fixture
def limits() -> Limits:
    return Limits()


def gate_on(store: StateStore, limits: Limits, **kwargs: object) -> QuotaGate:
    return QuotaGate(store, QuotaLimitsCache(limits), **kwargs)  # type: ignore[arg-type]


class Estimates:
    """An estimate callable that counts how often admission asked for it."""

    def __init__(self, tokens: int = 0, cost: int = 0) -> None:
        self.value = CallEstimate(tokens, cost)
        self.asked = 0

    async def __call__(self) -> CallEstimate:
        self.asked += 1
        return self.value


async def reserve(
    gate: QuotaGate,
    project_id: UUID,
    *,
    tokens: int = 0,
    cost: int = 0,
    key: KeyLimits | None = None,
) -> CallHold | None:
    return await gate.reserve(project_id, key, Estimates(tokens, cost))


async def code_of(gate: QuotaGate, project_id: UUID, **kwargs: object) -> str:
    try:
        hold = await reserve(gate, project_id, **kwargs)  # type: ignore[arg-type]
    except QuotaExceededError as exc:
        return exc.code
    assert hold is not None
    return "admitted"


async def used(gate: QuotaGate, limits: Limits, project_id: UUID) -> dict[str, int | None]:
    counted = await gate.usage_by_metric(project_id, limits.by_project[project_id])
    return {f"{metric}/{window}": use.used for (metric, window), use in counted.items()}


# ------------------------------------------------------------ reserve and settle


async def test_a_call_holds_its_estimate_and_settles_to_what_it_used(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(tokens_per_day=10_000, budget_per_month=5_000_000)
    gate = gate_on(harness.state(), limits)
    hold = await reserve(gate, project_id, tokens=1_500, cost=30_000)
    assert hold is not None
    counted = await used(gate, limits, project_id)
    assert counted["tokens/day"] == 1_500
    assert counted["cost/month"] == 30_000
    assert counted["requests/day"] == 1  # the request windows count as they always did
    await hold.settle(tokens=420, cost_micros=8_400)
    counted = await used(gate, limits, project_id)
    assert (counted["tokens/day"], counted["tokens/minute"]) == (420, 420)
    assert (counted["cost/day"], counted["cost/month"]) == (8_400, 8_400)
    assert counted["requests/day"] == 1
    await hold.settle(tokens=1, cost_micros=1)  # a second settle changes nothing
    assert (await used(gate, limits, project_id))["tokens/day"] == 420


async def test_an_overage_is_counted_past_the_limit(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(tokens_per_minute=1_000)
    gate = gate_on(harness.state(), limits)
    hold = await reserve(gate, project_id, tokens=900)
    assert hold is not None
    await hold.settle(tokens=1_300, cost_micros=0)  # the call happened: it counts
    assert (await used(gate, limits, project_id))["tokens/minute"] == 1_300
    assert await code_of(gate, project_id, tokens=1) == "token_limit_exceeded"


async def test_without_token_or_money_limits_no_estimate_and_no_hold(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(per_day=2)
    gate = gate_on(harness.state(), limits)
    estimates = Estimates(100, 100)
    assert await gate.reserve(project_id, None, estimates) is None
    assert estimates.asked == 0
    unlimited = uuid4()
    assert await gate.reserve(unlimited, None, estimates) is None
    assert estimates.asked == 0
    # The request quota still applies through the same call.
    assert await gate.reserve(project_id, None, estimates) is None
    with pytest.raises(QuotaExceededError) as refused:
        await gate.reserve(project_id, None, estimates)
    assert refused.value.code == "quota_exceeded"


async def test_full_windows_answer_their_own_codes_and_the_next_window(
    harness: Harness, limits: Limits
) -> None:
    clock = FakeClock("2030-05-20T22:30:00")
    project_id = limits.project(tokens_per_day=1_000, budget_per_month=50_000)
    gate = gate_on(harness.state(), limits, clock=clock)
    assert await code_of(gate, project_id, tokens=800, cost=10_000) == "admitted"
    with pytest.raises(QuotaExceededError) as refused:
        await reserve(gate, project_id, tokens=300, cost=10_000)
    assert refused.value.code == "token_limit_exceeded"
    assert refused.value.status_code == 429
    assert refused.value.retry_after == 90 * 60  # the day ends at midnight UTC
    assert "1000 tokens per day" in refused.value.message
    with pytest.raises(QuotaExceededError) as broke:
        await reserve(gate, project_id, tokens=10, cost=40_001)
    assert broke.value.code == "budget_exceeded"
    assert broke.value.window == "month"
    assert "0.05 per month" in broke.value.message
    # Both full: the one that resets last (the month) is what a retry waits for.
    with pytest.raises(QuotaExceededError) as both:
        await reserve(gate, project_id, tokens=300, cost=40_001)
    assert both.value.code == "budget_exceeded"
    # Refusals held nothing.
    counted = await used(gate, limits, project_id)
    assert (counted["tokens/day"], counted["cost/month"], counted["requests/day"]) == (
        800,
        10_000,
        1,
    )


async def test_a_call_larger_than_the_whole_limit_says_so(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(tokens_per_minute=500)
    gate = gate_on(harness.state(), limits)
    with pytest.raises(QuotaExceededError) as refused:
        await reserve(gate, project_id, tokens=4_000)
    assert refused.value.code == "token_limit_exceeded"
    assert "lower max_tokens" in refused.value.message


async def test_key_limits_refuse_the_key_and_not_its_project(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project()  # no project limit at all
    gate = gate_on(harness.state(), limits)
    thrifty = KeyLimits(uuid4(), tpm=1_000)
    capped = KeyLimits(uuid4(), budget_micros=20_000, budget_period="day")
    other = KeyLimits(uuid4(), tpm=1_000)
    assert await code_of(gate, project_id, tokens=900, key=thrifty) == "admitted"
    assert await code_of(gate, project_id, tokens=200, key=thrifty) == "token_limit_exceeded"
    assert await code_of(gate, project_id, tokens=900, key=other) == "admitted"
    assert await code_of(gate, project_id, cost=15_000, key=capped) == "admitted"
    assert await code_of(gate, project_id, cost=15_000, key=capped) == "budget_exceeded"
    # Outside the project's quota (a custom LLM): the key's budget still applies.
    with pytest.raises(QuotaExceededError):
        await gate.reserve(project_id, capped, Estimates(0, 6_000), project_quota=False)


async def test_a_released_hold_gives_everything_back(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(per_day=10, tokens_per_day=1_000)
    gate = gate_on(harness.state(), limits)
    hold = await reserve(gate, project_id, tokens=700)
    assert hold is not None
    await hold.release()
    counted = await used(gate, limits, project_id)
    assert (counted["tokens/day"], counted["requests/day"]) == (0, 0)


async def test_a_settle_after_the_hold_is_gone_still_counts_the_call(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(per_day=10, tokens_per_day=1_000, budget_per_day=90_000)
    store = harness.state()
    gate = gate_on(store, limits)
    hold = await reserve(gate, project_id, tokens=700, cost=50_000)
    assert hold is not None
    # The hold ran out (its replica was away longer than it lived): as if expired.
    assert await store.release(hold.hold_id)
    await hold.settle(tokens=250, cost_micros=4_000)
    counted = await used(gate, limits, project_id)
    assert (counted["tokens/day"], counted["cost/day"], counted["requests/day"]) == (
        250,
        4_000,
        1,
    )


async def test_a_long_call_keeps_its_hold_alive(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(tokens_per_day=1_000)
    gate = gate_on(harness.state(), limits, hold_ttl=0.4)
    hold = await reserve(gate, project_id, tokens=600)
    assert hold is not None
    await asyncio.sleep(1.2)  # three times the hold's life: extended meanwhile
    assert await code_of(gate, project_id, tokens=600) == "token_limit_exceeded"
    await hold.settle(tokens=100, cost_micros=0)
    assert (await used(gate, limits, project_id))["tokens/day"] == 100


async def test_holds_are_kept_by_one_timer_that_stops_when_none_is_live(
    harness: Harness, limits: Limits
) -> None:
    """The keeper arms one timer while holds are live and none when they are all
    settled, so an idle replica wakes for nothing; a settled hold is not extended."""
    project_id = limits.project(tokens_per_day=10_000)
    gate = gate_on(harness.state(), limits, hold_ttl=0.4)
    keeper = gate.hold_keeper
    holds = [await reserve(gate, project_id, tokens=100) for _ in range(3)]
    assert all(h is not None for h in holds)
    assert keeper._timer is not None
    for hold in holds:
        assert hold is not None
        await hold.settle(tokens=10, cost_micros=0)
    assert not keeper._live
    await asyncio.sleep(0.25)  # past a tick: it finds nothing and re-arms nothing
    assert keeper._timer is None
    assert (await used(gate, limits, project_id))["tokens/day"] == 30


async def test_a_dead_replicas_hold_expires(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(tokens_per_day=1_000)
    store = harness.state()
    gate = gate_on(store, limits, hold_ttl=0.3)
    hold = await reserve(gate, project_id, tokens=900)
    assert hold is not None
    gate.hold_keeper.stop()  # the replica died: nothing extends the hold any more
    await asyncio.sleep(0.5)
    assert await code_of(gate, project_id, tokens=900) == "admitted"


# ------------------------------------------------------------ across replicas


async def test_three_replicas_never_admit_past_a_budget(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(budget_per_day=100 * 7_000)
    gates = [gate_on(harness.state(), limits) for _ in range(3)]
    # As many in flight per replica as its Redis pool has connections: more only
    # queue for one, and on a loaded machine past the pool's wait (then fail-open).
    slots = [asyncio.Semaphore(16) for _ in gates]

    async def call(i: int) -> str:
        async with slots[i % 3]:
            try:
                hold = await reserve(gates[i % 3], project_id, tokens=10, cost=7_000)
            except QuotaExceededError as exc:
                return exc.code
            assert hold is not None
            await asyncio.sleep(0.01)
            await hold.settle(tokens=10, cost_micros=7_000)
            return "admitted"

    results = await asyncio.gather(*(call(i) for i in range(300)))
    assert results.count("admitted") == 100
    assert results.count("budget_exceeded") == 200
    assert (await used(gates[0], limits, project_id))["cost/day"] == 700_000


# ------------------------------------------------------------ outages


async def test_store_down_fail_open_admits_and_fail_closed_refuses(limits: Limits) -> None:
    store = RedisStateStore.from_url(CLOSED_PORT_URL)
    gate = gate_on(store, limits, registry=CollectorRegistry())
    open_project = limits.project(tokens_per_day=10)
    closed_project = limits.project(tokens_per_day=10, fail_closed=True)
    try:
        assert await reserve(gate, open_project, tokens=1_000) is None
        with pytest.raises(QuotaUnavailableError):
            await reserve(gate, closed_project, tokens=1)
    finally:
        await store.close()


# ------------------------------------------------------------ threshold alerts


class Sink:
    def __init__(self) -> None:
        self.alerts: list[BudgetAlert] = []

    async def alert(self, alert: BudgetAlert) -> None:
        self.alerts.append(alert)


async def test_each_threshold_alert_is_raised_once_across_replicas(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(budget_per_day=100_000)
    bus = MemoryEventBus()
    sinks = [Sink() for _ in range(3)]
    gates = [
        gate_on(
            harness.state(),
            limits,
            alerts=BudgetAlerts(harness.state(), bus, origin=f"r{i}", sinks=[sinks[i]]),
        )
        for i in range(3)
    ]
    async with bus.subscribe(CHANNEL) as events:
        for i in range(9):  # 90 % reserved, spread over the replicas
            hold = await reserve(gates[i % 3], project_id, cost=10_000)
            assert hold is not None
            await hold.settle(tokens=0, cost_micros=10_000)
        assert await code_of(gates[0], project_id, cost=20_000) == "budget_exceeded"
        for gate in gates:
            assert gate.alerts is not None
            await gate.alerts.drain()
        await asyncio.sleep(0.05)
        received = []
        while True:
            try:
                received.append(await asyncio.wait_for(anext(events), 0.2))
            except TimeoutError:
                break
    raised = [a for sink in sinks for a in sink.alerts]
    assert sorted(a.threshold for a in raised) == [80, 100]
    assert {(e["threshold"], e["metric"], e["window"]) for e in received} == {
        (80, "cost", "day"),
        (100, "cost", "day"),
    }
    eighty = next(a for a in raised if a.threshold == 80)
    assert (eighty.limit, eighty.scope) == (100_000, "project")
    assert eighty.used >= 80_000
    assert eighty.currency == "USD"


# ------------------------------------------------------------ the meter's side


class Rows:
    def __init__(self) -> None:
        self.entries: list[object] = []

    async def record(self, entry: object) -> None:
        self.entries.append(entry)


async def test_a_cancelled_call_gives_its_reservation_back(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(tokens_per_day=1_000)
    gate = gate_on(harness.state(), limits)
    meter = Meter(Rows(), time.monotonic)
    record = CallRecord(endpoint="chat", model_requested="m", project_id=project_id)
    record.hold = await reserve(gate, project_id, tokens=800)

    async def the_call() -> None:
        async with meter.failures(record):
            await asyncio.sleep(30)  # the upstream call the client gives up on

    task = asyncio.create_task(the_call())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert record.hold is not None
    assert record.hold.settled
    assert (await used(gate, limits, project_id))["tokens/day"] == 0


async def test_a_settle_is_sent_even_when_its_waiter_is_cancelled(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(tokens_per_day=1_000)
    gate = gate_on(harness.state(), limits)
    first = await reserve(gate, project_id, tokens=300)
    second = await reserve(gate, project_id, tokens=300)
    assert first is not None
    assert second is not None
    waiter = asyncio.ensure_future(first.settle(tokens=10, cost_micros=0))
    other = second.settle(tokens=20, cost_micros=0)  # same batch, awaited to the end
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await other
    await gate.drain()
    assert (await used(gate, limits, project_id))["tokens/day"] == 30


async def test_a_metered_call_settles_its_tokens(harness: Harness, limits: Limits) -> None:
    project_id = limits.project(tokens_per_day=1_000)
    gate = gate_on(harness.state(), limits)
    rows = Rows()
    meter = Meter(rows, time.monotonic)
    record = CallRecord(endpoint="chat", model_requested="m", project_id=project_id)
    record.hold = await reserve(gate, project_id, tokens=800)
    record.usage = Usage(prompt_tokens=30, completion_tokens=12)
    await meter.record(record)
    assert (await used(gate, limits, project_id))["tokens/day"] == 42
    assert len(rows.entries) == 1
