"""One ``StateStore`` contract, run against the memory and the Redis implementation."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from app.lib.state.base import StateStore, WindowLimit
from app.lib.state.memory import MemoryStateStore
from app.lib.state.redis import RedisStateStore
from tests.support.state_harness import REDIS_URL, Harness

TTL = 0.5
PAST_TTL = 0.7
WINDOW = 1.0
"""For checks made inside a window that must still be open: a stall of the loop or
of the shared Redis must not close it first."""
INSIDE_WINDOW = 0.25
PAST_WINDOW = WINDOW + 0.2


async def test_get_set_delete_exists(store: StateStore) -> None:
    assert await store.get("k") is None
    assert not await store.exists("k")

    await store.set("k", b"v1")
    assert await store.get("k") == b"v1"
    assert await store.exists("k")

    await store.set("k", b"\x00\xffbinary")
    assert await store.get("k") == b"\x00\xffbinary"

    assert await store.delete("k")
    assert not await store.delete("k")
    assert await store.get("k") is None
    assert not await store.exists("k")


async def test_set_ttl_expires(store: StateStore) -> None:
    await store.set("short", b"x", ttl=TTL)
    await store.set("forever", b"y")
    assert await store.get("short") == b"x"
    await asyncio.sleep(PAST_TTL)
    assert await store.get("short") is None
    assert not await store.exists("short")
    assert not await store.delete("short")
    assert await store.get("forever") == b"y"


async def test_set_without_ttl_clears_previous_ttl(store: StateStore) -> None:
    await store.set("k", b"a", ttl=TTL)
    await store.set("k", b"b")
    await asyncio.sleep(PAST_TTL)
    assert await store.get("k") == b"b"


async def test_set_rejects_non_positive_ttl(store: StateStore) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.set("k", b"v", ttl=0)


async def test_set_if_absent(store: StateStore) -> None:
    assert await store.set_if_absent("lease", b"first", ttl=TTL)
    assert not await store.set_if_absent("lease", b"second")
    assert await store.get("lease") == b"first"

    await asyncio.sleep(PAST_TTL)
    assert await store.set_if_absent("lease", b"third")
    assert await store.get("lease") == b"third"


async def test_set_if_absent_single_winner_across_replicas(harness: Harness) -> None:
    replicas = [harness.state() for _ in range(3)]
    results = await asyncio.gather(
        *(replicas[i % 3].set_if_absent("pin", b"%d" % i) for i in range(30))
    )
    assert results.count(True) == 1
    winner = results.index(True)
    assert await replicas[0].get("pin") == b"%d" % winner


async def test_incr(store: StateStore) -> None:
    assert await store.incr("n") == 1
    assert await store.incr("n", 5) == 6
    assert await store.incr("n", -2) == 4
    assert await store.get("n") == b"4"


async def test_incr_ttl_applies_only_at_creation(store: StateStore) -> None:
    assert await store.incr("n", ttl=WINDOW) == 1
    await asyncio.sleep(INSIDE_WINDOW)
    # A later ttl must not extend the window the first call opened.
    assert await store.incr("n", ttl=10) == 2
    await asyncio.sleep(PAST_WINDOW - INSIDE_WINDOW)
    assert await store.get("n") is None
    assert await store.incr("n", ttl=TTL) == 1


async def test_incr_without_ttl_on_new_key_persists(store: StateStore) -> None:
    await store.incr("n")
    await asyncio.sleep(PAST_TTL)
    assert await store.get("n") == b"1"


async def test_admit_up_to_limit_then_refuse(store: StateStore) -> None:
    for expected in (3, 6, 9, 10):
        d = await store.admit("w", 3 if expected < 10 else 1, limit=10, window=5)
        assert d.allowed
        assert d.current == expected
        assert d.limit == 10
        assert d.retry_after == 0

    refused = await store.admit("w", 1, limit=10, window=5)
    assert not refused.allowed
    assert refused.current == 10
    assert 0 < refused.retry_after <= 5
    # Refusals consume nothing.
    assert (await store.admit("w", 1, limit=10, window=5)).current == 10
    assert await store.get("w") == b"10"


async def test_admit_refusal_does_not_block_smaller_request(store: StateStore) -> None:
    assert (await store.admit("w", 8, limit=10, window=5)).allowed
    assert not (await store.admit("w", 3, limit=10, window=5)).allowed
    d = await store.admit("w", 2, limit=10, window=5)
    assert d.allowed
    assert d.current == 10


async def test_admit_oversized_request_on_empty_window(store: StateStore) -> None:
    d = await store.admit("w", 11, limit=10, window=5)
    assert not d.allowed
    assert d.current == 0
    assert d.retry_after > 0
    assert not await store.exists("w")


async def test_admit_window_resets_after_expiry(store: StateStore) -> None:
    assert (await store.admit("w", 2, limit=2, window=TTL)).allowed
    refused = await store.admit("w", 1, limit=2, window=TTL)
    assert not refused.allowed
    assert 0 < refused.retry_after <= TTL + 1e-6  # float clock arithmetic

    await asyncio.sleep(PAST_TTL)
    d = await store.admit("w", 1, limit=2, window=TTL)
    assert d.allowed
    assert d.current == 1


async def test_admit_window_is_fixed_not_sliding(store: StateStore) -> None:
    assert (await store.admit("w", 1, limit=5, window=WINDOW)).allowed
    await asyncio.sleep(INSIDE_WINDOW)
    assert (await store.admit("w", 1, limit=5, window=WINDOW)).current == 2
    await asyncio.sleep(PAST_WINDOW - INSIDE_WINDOW)
    assert (await store.admit("w", 1, limit=5, window=WINDOW)).current == 1


async def test_admit_repairs_window_without_expiry(store: StateStore) -> None:
    await store.set("w", b"5")
    refused = await store.admit("w", 1, limit=5, window=TTL)
    assert not refused.allowed
    assert 0 < refused.retry_after <= TTL + 1e-6  # float clock arithmetic
    await asyncio.sleep(PAST_TTL)
    assert (await store.admit("w", 1, limit=5, window=TTL)).allowed


async def test_concurrent_admit_never_over_admits(harness: Harness) -> None:
    # Three replicas (three Redis clients on the redis backend) race for one window.
    replicas = [harness.state() for _ in range(3)]
    decisions = await asyncio.gather(
        *(replicas[i % 3].admit("quota", 1, limit=100, window=30) for i in range(300))
    )
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == 100
    assert sorted(d.current for d in allowed) == list(range(1, 101))
    assert all(d.current == 100 and d.retry_after > 0 for d in decisions if not d.allowed)
    assert await replicas[0].get("quota") == b"100"


async def test_concurrent_incr_is_atomic(harness: Harness) -> None:
    replicas = [harness.state() for _ in range(3)]
    results = await asyncio.gather(*(replicas[i % 3].incr("n", ttl=30) for i in range(300)))
    assert sorted(results) == list(range(1, 301))


def windows(*specs: tuple[str, int | None, float]) -> list[WindowLimit]:
    return [WindowLimit(key, limit, ttl) for key, limit, ttl in specs]


async def test_admit_windows_counts_every_window(store: StateStore) -> None:
    spec = windows(("m", 3, 5), ("d", 10, 50), ("mo", None, 500))
    for expected in (1, 2, 3):
        d = await store.admit_windows(spec)
        assert d.allowed
        assert d.full == ()
        assert [w.key for w in d.windows] == ["m", "d", "mo"]
        assert [w.current for w in d.windows] == [expected] * 3
        assert [w.limit for w in d.windows] == [3, 10, None]
        assert all(w.fits and w.retry_after == 0 for w in d.windows)
    assert await store.get("m") == b"3"
    assert await store.get("mo") == b"3"


async def test_admit_windows_refuses_all_or_nothing(store: StateStore) -> None:
    spec = windows(("m", 2, 5), ("d", 10, 50))
    assert (await store.admit_windows(spec)).allowed
    assert (await store.admit_windows(spec)).allowed
    refused = await store.admit_windows(spec)
    assert not refused.allowed
    minute, day = refused.windows
    assert (minute.fits, minute.current, minute.limit) == (False, 2, 2)
    assert 0 < minute.retry_after <= 5
    # The window with room is reported unchanged and was not incremented.
    assert (day.fits, day.current, day.retry_after) == (True, 2, 0)
    assert refused.full == (minute,)
    assert await store.get("d") == b"2"


async def test_admit_windows_reports_every_full_window(store: StateStore) -> None:
    spec = windows(("a", 1, 5), ("b", 1, 50), ("c", 5, 50))
    assert (await store.admit_windows(spec)).allowed
    refused = await store.admit_windows(spec)
    assert [w.fits for w in refused.windows] == [False, False, True]
    a, b, _ = refused.windows
    assert 0 < a.retry_after <= 5
    assert 5 < b.retry_after <= 50


async def test_admit_windows_amount_and_zero_limit(store: StateStore) -> None:
    assert (await store.admit_windows(windows(("w", 10, 5)), amount=7)).allowed
    refused = await store.admit_windows(windows(("w", 10, 5)), amount=4)
    assert not refused.allowed
    assert refused.windows[0].current == 7
    assert (await store.admit_windows(windows(("w", 10, 5)), amount=3)).windows[0].current == 10

    # A zero limit admits nothing and creates no key; the hint is a whole window.
    zero = await store.admit_windows(windows(("z", 0, 5), ("other", None, 5)))
    assert not zero.allowed
    assert zero.windows[0].retry_after == pytest.approx(5, abs=0.01)
    assert not await store.exists("z")
    assert not await store.exists("other")


async def test_admit_windows_each_window_keeps_its_own_ttl(store: StateStore) -> None:
    spec = windows(("short", 1, TTL), ("long", 5, 30))
    assert (await store.admit_windows(spec)).allowed
    refused = await store.admit_windows(spec)
    assert not refused.allowed
    assert 0 < refused.windows[0].retry_after <= TTL + 1e-6
    await asyncio.sleep(PAST_TTL)
    d = await store.admit_windows(spec)
    assert d.allowed
    assert [w.current for w in d.windows] == [1, 2]


async def test_admit_windows_ttl_applies_only_at_creation(store: StateStore) -> None:
    assert (await store.admit_windows(windows(("w", 9, WINDOW)))).allowed
    await asyncio.sleep(INSIDE_WINDOW)
    assert (await store.admit_windows(windows(("w", 9, 30)))).windows[0].current == 2
    await asyncio.sleep(PAST_WINDOW - INSIDE_WINDOW)
    assert (await store.admit_windows(windows(("w", 9, 30)))).windows[0].current == 1


async def test_admit_windows_repairs_window_without_expiry(store: StateStore) -> None:
    await store.set("w", b"5")
    refused = await store.admit_windows(windows(("w", 5, TTL), ("x", None, TTL)))
    assert not refused.allowed
    assert 0 < refused.windows[0].retry_after <= TTL + 1e-6
    await asyncio.sleep(PAST_TTL)
    assert (await store.admit_windows(windows(("w", 5, TTL)))).allowed


async def test_admit_windows_shares_counters_with_admit(store: StateStore) -> None:
    assert (await store.admit("w", 4, limit=5, window=5)).allowed
    assert not (await store.admit_windows(windows(("w", 4, 5)))).allowed
    assert (await store.admit_windows(windows(("w", 5, 5)))).windows[0].current == 5


async def test_admit_windows_rejects_bad_arguments(store: StateStore) -> None:
    with pytest.raises(ValueError, match="amount"):
        await store.admit_windows(windows(("w", 1, 5)), amount=0)
    with pytest.raises(ValueError, match="twice"):
        await store.admit_windows(windows(("w", 1, 5), ("w", 2, 5)))
    with pytest.raises(ValueError, match="ttl"):
        await store.admit_windows(windows(("w", 1, 0)))
    with pytest.raises(ValueError, match="limit"):
        await store.admit_windows(windows(("w", -1, 5)))
    assert not await store.exists("w")
    empty = await store.admit_windows([])
    assert empty.allowed
    assert empty.windows == ()


async def test_concurrent_admit_windows_never_over_admits(harness: Harness) -> None:
    # 300 callers on three replicas; the day window (30) binds before the minute (100).
    replicas = [harness.state() for _ in range(3)]
    spec = windows(("q:m", 100, 30), ("q:d", 30, 60), ("q:mo", None, 60))
    decisions = await asyncio.gather(*(replicas[i % 3].admit_windows(spec) for i in range(300)))
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == 30
    assert sorted(d.windows[1].current for d in allowed) == list(range(1, 31))
    # Refusals incremented nothing: every window holds exactly the admitted count.
    for key in ("q:m", "q:d", "q:mo"):
        assert await replicas[0].get(key) == b"30"
    for d in decisions:
        if not d.allowed:
            assert [w.fits for w in d.windows] == [True, False, True]


async def test_concurrent_admit_windows_shared_window_is_all_or_nothing(
    harness: Harness,
) -> None:
    # Ten tenants with their own roomy window share one small window: any partial
    # increment would leave the tenants' counts summing past the shared count.
    replicas = [harness.state() for _ in range(3)]
    calls = [
        replicas[i % 3].admit_windows(windows((f"t{i % 10}", 25, 30), ("shared", 40, 30)))
        for i in range(200)
    ]
    decisions = await asyncio.gather(*calls)
    assert sum(d.allowed for d in decisions) == 40
    per_tenant = [int(await replicas[0].get(f"t{n}") or b"0") for n in range(10)]
    assert sum(per_tenant) == 40
    assert await replicas[0].get("shared") == b"40"


async def test_samples_bounded_and_ordered(store: StateStore) -> None:
    assert await store.samples("lat") == []
    for v in range(1, 8):
        await store.push_sample("lat", v * 0.5, max_samples=5)
    assert await store.samples("lat") == [1.5, 2.0, 2.5, 3.0, 3.5]


async def test_samples_keep_float_precision(store: StateStore) -> None:
    await store.push_sample("lat", 0.1 + 0.2, max_samples=3)
    await store.push_sample("lat", 1e-9, max_samples=3)
    assert await store.samples("lat") == [0.1 + 0.2, 1e-9]


async def test_push_sample_rejects_empty_bound(store: StateStore) -> None:
    with pytest.raises(ValueError, match="max_samples"):
        await store.push_sample("lat", 1.0, max_samples=0)


async def test_ping(store: StateStore) -> None:
    assert await store.ping()


async def test_redis_ping_false_when_unreachable() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    store = RedisStateStore.from_url("redis://127.0.0.1:1/0")
    try:
        assert await store.ping() is False
    finally:
        await store.close()


async def test_redis_requires_bytes_client() -> None:
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            RedisStateStore(client)
    finally:
        await client.aclose()


async def test_memory_purges_expired_keys_on_writes() -> None:
    now = [0.0]
    store = MemoryStateStore(clock=lambda: now[0], purge_interval=10)
    for i in range(100):
        await store.set(f"k{i}", b"v", ttl=1)
    assert len(store) == 100
    now[0] = 11.0
    await store.set("other", b"v")
    assert len(store) == 1
