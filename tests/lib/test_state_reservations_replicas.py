"""Reservations across replicas (exactness under concurrency), their Redis layout, the
fallback store with Redis unreachable, and the memory store's hold bookkeeping."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry
from redis.crc import key_slot

from app.lib.state.base import ReserveWindow, UnknownHoldWindowError
from app.lib.state.fallback import FallbackStateStore, StateStoreUnavailableError
from app.lib.state.memory import MemoryStateStore
from app.lib.state.memory_holds import WindowHolds
from app.lib.state.redis import RedisStateStore
from tests.support.state_harness import Harness

LONG = 60.0


async def test_concurrent_reserves_admit_exactly_the_limit(harness: Harness) -> None:
    # 300 calls on three replicas (three Redis clients) race for 100 requests.
    replicas = [harness.state() for _ in range(3)]
    spec = [
        ReserveWindow("q:req", 100, LONG, 1),
        ReserveWindow("q:tok", None, LONG, 40),
        ReserveWindow("q:cost", None, LONG, 7),
    ]
    decisions = await asyncio.gather(
        *(replicas[i % 3].reserve(spec, f"h{i}", LONG) for i in range(300))
    )
    allowed = [i for i, d in enumerate(decisions) if d.allowed]
    assert len(allowed) == 100
    assert sorted(decisions[i].windows[0].current for i in allowed) == list(range(1, 101))
    assert [await replicas[0].get(k) for k in ("q:req", "q:tok", "q:cost")] == [
        b"100",
        b"4000",
        b"700",
    ]
    for d in decisions:
        if not d.allowed:
            assert [w.fits for w in d.windows] == [False, True, True]
            assert d.windows[0].retry_after > 0
    # Exactly the admitted holds exist: each settles once, the refused ones never.
    settled = await asyncio.gather(
        *(replicas[i % 3].settle(f"h{i}", {"q:tok": 10}) for i in range(300))
    )
    assert [i for i, ok in enumerate(settled) if ok] == allowed
    total = await replicas[1].window_total("q:tok")
    assert (total.total, total.held) == (1_000, 0)
    assert (await replicas[2].window_total("q:req")).held == 0


async def test_budget_overshoot_is_bounded_by_in_flight_overage(harness: Harness) -> None:
    """Waves of calls reserve an estimated cost on three replicas while the previous
    wave settles to actuals (some above the estimate): no reservation is admitted past
    the budget, refunds make room for more calls, and the spend is the sum of actuals,
    over the budget by at most the overages settled after the last admission."""
    replicas = [harness.state() for _ in range(3)]
    budget, estimate, wave = 1_000, 10, 40
    actuals: dict[int, int] = {}

    async def reserve(i: int) -> None:
        spec = [ReserveWindow("budget", budget, LONG, estimate)]
        d = await replicas[i % 3].reserve(spec, f"c{i}", LONG)
        if d.allowed:
            assert d.windows[0].current <= budget
            actuals[i] = (2, 10, 14)[i % 3]

    async def settle(i: int) -> None:
        if i in actuals:
            assert await replicas[(i + 1) % 3].settle(f"c{i}", {"budget": actuals[i]})

    await asyncio.gather(*(reserve(i) for i in range(wave)))
    for w in range(1, 10):
        this, last = range(w * wave, (w + 1) * wave), range((w - 1) * wave, w * wave)
        await asyncio.gather(*(reserve(i) for i in this), *(settle(i) for i in last))
    await asyncio.gather(*(settle(i) for i in range(9 * wave, 10 * wave)))

    spent = sum(actuals.values())
    assert await replicas[0].get("budget") == str(spent).encode()
    overage = sum(max(0, a - estimate) for a in actuals.values())
    assert budget // 2 < spent <= budget + overage
    # Wave 3 reserved after wave 1 settled (refunds of 8 on a third of it): more than
    # budget // estimate calls got in.
    assert len(actuals) > budget // estimate
    assert (await replicas[1].window_total("budget")).held == 0


async def test_a_shared_window_is_all_or_nothing_across_tenants(harness: Harness) -> None:
    replicas = [harness.state() for _ in range(3)]

    def spec(i: int) -> list[ReserveWindow]:
        return [ReserveWindow(f"t{i % 10}", 25, LONG, 1), ReserveWindow("shared", 80, LONG, 2)]

    decisions = await asyncio.gather(
        *(replicas[i % 3].reserve(spec(i), f"h{i}", LONG) for i in range(200))
    )
    assert sum(d.allowed for d in decisions) == 40
    per_tenant = [int(await replicas[0].get(f"t{n}") or b"0") for n in range(10)]
    assert sum(per_tenant) == 40
    assert await replicas[0].get("shared") == b"80"


async def test_concurrent_settle_and_release_of_one_hold_apply_once(harness: Harness) -> None:
    replicas = [harness.state() for _ in range(3)]
    assert (await replicas[0].reserve([ReserveWindow("w", None, LONG, 10)], "h", LONG)).allowed
    results = await asyncio.gather(
        *(
            replicas[i % 3].settle("h", {"w": 3}) if i % 2 else replicas[i % 3].release("h")
            for i in range(30)
        )
    )
    assert results.count(True) == 1
    assert await replicas[0].get("w") == (b"3" if results.index(True) % 2 else b"0")


async def test_a_hold_settles_right_wherever_it_was_taken(harness: Harness) -> None:
    # The id is reused on another replica for other windows: the replica that took
    # the first hold must settle the hold that exists now, not the one it remembers.
    a, b = harness.state(), harness.state()
    assert (await a.reserve([ReserveWindow("x", None, LONG, 5)], "h", LONG)).allowed
    assert await b.settle("h", {"x": 1})
    two = [ReserveWindow("y", None, LONG, 4), ReserveWindow("z", None, LONG, 6)]
    assert (await b.reserve(two, "h", LONG)).allowed
    with pytest.raises(UnknownHoldWindowError):
        await a.settle("h", {"x": 2})
    assert await a.settle("h", {"y": 3})
    assert [await a.get(k) for k in ("x", "y", "z")] == [b"1", b"3", b"6"]
    assert not await a.release("h")
    assert not await b.release("h")


# -- Redis layout -------------------------------------------------------------------------


@pytest.mark.parametrize("harness", ["redis"], indirect=True)
async def test_redis_keys_of_a_reservation_share_the_callers_hash_tag(harness: Harness) -> None:
    store = harness.state()
    assert isinstance(store, RedisStateStore)
    spec = [ReserveWindow("quota:{p1}:m:7", 5, 30, 1), ReserveWindow("quota:{p1}:d:7", 9, 90, 1)]
    assert (await store.reserve(spec, "{p1}:call-1", LONG)).allowed
    p = harness.prefix
    record, index = f"{p}hold:{{p1}}:call-1", f"{p}holds:{{p1}}"
    counters = [f"{p}quota:{{p1}}:{w}:7" for w in ("m", "d")]
    keys = await _keys(store, p)
    assert keys == sorted([record, index, *counters])
    assert len({key_slot(k.encode()) for k in keys}) == 1
    # Every key ends: the counters with their window, the record and the index with the
    # longest window a hold in them counts in (here longer than the hold).
    longest = await store.client.pttl(counters[1])
    assert 0 < await store.client.pttl(counters[0]) <= 30_000
    assert 0 < longest <= 90_000
    for key in (record, index):
        assert abs(await store.client.pttl(key) - longest) < 50
    # A hold outliving its windows keeps its index and record as long as it lives.
    assert await store.extend("{p1}:call-1", 200)
    assert await store.client.pttl(index) > 100_000
    assert await store.client.pttl(record) > 100_000
    # Settled, only the counters stay.
    assert await store.settle("{p1}:call-1", {})
    assert await _keys(store, p) == sorted(counters)


async def _keys(store: RedisStateStore, prefix: str) -> list[str]:
    found = [k async for k in store.client.scan_iter(match=prefix + "*", count=1000)]
    return sorted(k.decode() for k in found)


# What a replica SIGKILLed with ``dead`` holds of 3 units in flight in window KEYS[1]
# leaves behind in the layout ``redis_holds`` documents (KEYS[2]: the hold index;
# ARGV: the window's settled units, the number of holds, the records' key prefix).
# Written by a script so that the recorded window end is read on the server's clock.
_DEAD_HOLDS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = tonumber(ARGV[2])
redis.call('SET', KEYS[1], tonumber(ARGV[1]) + 3 * dead, 'PX', 60000)
local field = '3:' .. string.format('%d', now + redis.call('PTTL', KEYS[1]))
for i = 1, dead do
  local record = ARGV[3] .. 'dead' .. i
  redis.call('HSET', record, KEYS[1], field)
  redis.call('PEXPIRE', record, 60000)
  redis.call('ZADD', KEYS[2], now + 200, 'dead' .. i)
end
redis.call('PEXPIRE', KEYS[2], 60000)
"""


@pytest.mark.parametrize("harness", ["redis"], indirect=True)
async def test_redis_purges_thousands_of_expired_holds_at_once(harness: Harness) -> None:
    """A replica killed with more holds in flight than Lua takes arguments in one call
    leaves them behind; one reserve drops all, their records included."""
    store = harness.state()
    assert isinstance(store, RedisStateStore)
    p = harness.prefix
    counter, index = p + "w", p + "holds"
    await store.client.eval(_DEAD_HOLDS, 2, counter, index, 4, 2_500, p + "hold:")
    held = await store.window_total("w")
    assert (held.total, held.held) == (7_504, 7_500)
    await asyncio.sleep(0.3)
    gone = await store.window_total("w")
    assert (gone.total, gone.held) == (4, 0)
    assert await store.get("w") == b"7504"  # reads discount, they do not write
    d = await store.reserve([ReserveWindow("w", 10, LONG, 3)], "alive", LONG)
    assert d.allowed
    assert d.windows[0].current == 7
    assert await store.client.zrange(index, 0, -1) == [b"alive"]
    assert await _keys(store, p) == sorted([counter, index, p + "hold:alive"])
    for key in (counter, index, p + "hold:alive"):
        assert await store.client.pttl(key) > 0


# -- Redis unreachable ------------------------------------------------------------------


async def test_fallback_never_reserves_on_local_memory_when_redis_is_unreachable() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    store = FallbackStateStore(
        RedisStateStore.from_url("redis://127.0.0.1:1/0"), registry=CollectorRegistry()
    )
    try:
        with pytest.raises(StateStoreUnavailableError, match="reserve"):
            await store.reserve([ReserveWindow("w", 5, LONG, 1)], "h", LONG)
        assert store.degraded
        # Once degraded, every reservation call fails at once, and none is served locally
        # (a per-replica count would let N replicas spend N budgets).
        with pytest.raises(StateStoreUnavailableError, match="reserve"):
            await store.reserve([ReserveWindow("w", 5, LONG, 1)], "h", LONG)
        with pytest.raises(StateStoreUnavailableError, match="settle"):
            await store.settle("h", {"w": 1})
        with pytest.raises(StateStoreUnavailableError, match="release"):
            await store.release("h")
        with pytest.raises(StateStoreUnavailableError, match="extend"):
            await store.extend("h", LONG)
        with pytest.raises(StateStoreUnavailableError, match="window_total"):
            await store.window_total("w")
        assert len(store.local) == 0
        assert (await store.local.window_total("w")).total == 0
    finally:
        await store.close()


async def test_fallback_passes_reservations_and_argument_errors_through(harness: Harness) -> None:
    store = FallbackStateStore(harness.state(), registry=CollectorRegistry())
    other = harness.state()
    assert (await store.reserve([ReserveWindow("w", 5, LONG, 4)], "h", LONG)).allowed
    assert (await other.window_total("w")).held == 4
    with pytest.raises(ValueError, match="amount"):
        await store.reserve([ReserveWindow("w", 5, LONG, -1)], "x", LONG)
    # A caller's mistake is not an outage.
    assert not store.degraded
    assert await store.extend("h", LONG)
    assert await store.settle("h", {"w": 2})
    assert not await store.release("h")
    assert (await store.window_total("w")).total == 2
    assert await other.get("w") == b"2"


# -- memory bookkeeping -----------------------------------------------------------------


def test_window_holds_purge_only_expired_holds() -> None:
    holds = WindowHolds()
    holds.add("a", 5, 10.0)
    holds.add("b", 7, 20.0)
    assert holds.take("a") == 5
    assert holds.take("a") is None
    # "a" returns with a later expiry: its stale heap entry at 10 must not drop it.
    holds.add("a", 3, 30.0)
    assert holds.split(20.0) == (7, 3)
    assert holds.purge(15.0) == 0
    assert holds.split(15.0) == (0, 10)
    assert holds.purge(20.0) == 7
    assert holds.split(20.0) == (0, 3)
    assert holds.purge(30.0) == 3
    assert holds.split(30.0) == (0, 0)
    # An extended hold outlives its first expiry, whose heap entry turns stale.
    holds.add("c", 4, 40.0)
    assert holds.extend("c", 50.0)
    assert not holds.extend("gone", 50.0)
    assert holds.purge(45.0) == 0
    assert holds.purge(50.0) == 4


def test_window_holds_stay_bounded_when_settled() -> None:
    # Settled holds leave stale heap entries behind; they must not pile up for as long
    # as a hold could live.
    holds = WindowHolds()
    for i in range(5_000):
        holds.add(f"h{i}", 1, LONG)
        assert holds.take(f"h{i}") == 1
        assert len(holds) <= 64 + 1
    holds.add("live", 2, LONG)
    assert holds.split(0.0) == (0, 2)
    assert holds.purge(LONG) == 2


async def test_memory_store_forgets_settled_and_expired_holds() -> None:
    now = [0.0]
    store = MemoryStateStore(clock=lambda: now[0], purge_interval=10)
    for i in range(100):
        assert (await store.reserve([ReserveWindow("w", None, LONG, 2)], f"h{i}", 5)).allowed
    for i in range(50):
        assert await store.settle(f"h{i}", {"w": 1})
    assert await store.get("w") == b"150"
    now[0] = 11.0
    # The periodic sweep drops expired hold records; the window discounts their units.
    await store.set("other", b"x")
    assert store.hold_records() == 0
    assert (await store.window_total("w")).total == 50
    # The read discounted the expired units; the next reserve purges them.
    assert await store.get("w") == b"150"
    d = await store.reserve([ReserveWindow("w", 60, LONG, 2)], "next", 5)
    assert d.windows[0].current == 52
