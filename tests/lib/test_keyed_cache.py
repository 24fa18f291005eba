"""``KeyedCache``: single-flight loads, the epoch guard, bounds and eviction."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from app.lib.keyed_cache import KeyedCache, StaleWhileFailing


class Source:
    """A loader over a dict, counting loads; a test may hold loads at a gate."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)
        self.loads: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def __call__(self, key: str) -> str:
        self.loads.append(key)
        value = self.values.get(key, f"{key}-default")
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return value

    def release(self) -> None:
        """Let the loads held at the gate finish."""
        assert self.gate is not None
        self.gate.set()


@contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler ("Task exception was never retrieved")."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(previous)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def held_get(source: Source, cache: KeyedCache[str, str]) -> asyncio.Future[str]:
    """A ``get("a")`` started and waiting at the source's (new) gate."""
    source.gate = asyncio.Event()
    pending = asyncio.ensure_future(cache.get("a"))
    await settle()
    return pending


async def cancel(caller: asyncio.Future[str]) -> None:
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_a_miss_loads_once_then_hits_answer_from_memory() -> None:
    source = Source(a="A")
    cache: KeyedCache[str, str] = KeyedCache(source)
    assert cache.peek("a") is None
    assert "a" not in cache
    assert await cache.get("a") == "A"
    source.values["a"] = "changed"
    assert await cache.get("a") == "A"
    assert cache.peek("a") == "A"
    assert "a" in cache
    assert (len(cache), cache.weight, list(cache.values())) == (1, 1, ["A"])
    assert source.loads == ["a"]


async def test_concurrent_misses_share_one_load() -> None:
    source = Source(a="A")
    cache: KeyedCache[str, str] = KeyedCache(source)
    source.gate = asyncio.Event()
    waiting = [asyncio.ensure_future(cache.get("a")) for _ in range(20)]
    await settle()
    source.release()
    assert await asyncio.gather(*waiting) == ["A"] * 20
    assert source.loads == ["a"]
    assert cache.peek("a") == "A"


async def test_load_joins_the_load_in_flight_even_when_cached() -> None:
    source = Source(a="A")
    cache: KeyedCache[str, str] = KeyedCache(source)
    await cache.get("a")
    source.values["a"] = "A2"
    source.gate = asyncio.Event()
    waiting = [asyncio.ensure_future(cache.load("a")) for _ in range(5)]
    await settle()
    assert cache.peek("a") == "A"  # still served while the reload runs
    source.release()
    assert await asyncio.gather(*waiting) == ["A2"] * 5
    assert cache.peek("a") == "A2"
    assert source.loads == ["a", "a"]


@pytest.mark.parametrize("invalidation", ["key", "all", "other key"])
async def test_a_load_racing_an_invalidation_is_not_stored(invalidation: str) -> None:
    source = Source(a="old")
    cache: KeyedCache[str, str] = KeyedCache(source)
    first = await held_get(source, cache)
    source.values["a"] = "new"
    if invalidation == "key":
        cache.invalidate("a")
    elif invalidation == "all":
        cache.invalidate_all()
    else:
        cache.invalidate("b")
    source.release()
    assert await first == "old"  # its caller gets what it read...
    assert cache.peek("a") is None  # ...but it is not kept
    source.gate = None
    assert await cache.get("a") == "new"
    assert cache.peek("a") == "new"


async def test_a_caller_after_an_invalidation_does_not_join_the_outdated_load() -> None:
    source = Source(a="old")
    cache: KeyedCache[str, str] = KeyedCache(source)
    first = await held_get(source, cache)
    source.values["a"] = "new"
    cache.invalidate("a")
    second = asyncio.ensure_future(cache.get("a"))
    await settle()
    assert source.loads == ["a", "a"]
    source.release()
    assert (await first, await second) == ("old", "new")
    assert cache.peek("a") == "new"  # the outdated load, finishing, did not overwrite it


async def test_invalidation_drops_one_key_or_all() -> None:
    source = Source(a="A", b="B")
    cache: KeyedCache[str, str] = KeyedCache(source)
    await cache.get("a")
    await cache.get("b")
    cache.invalidate("a")
    cache.invalidate("missing")
    assert ("a" in cache, "b" in cache, len(cache)) == (False, True, 1)
    await cache.get("a")
    cache.invalidate_all()
    assert (len(cache), cache.weight) == (0, 0)
    assert source.loads == ["a", "b", "a"]


async def test_an_invalidation_may_keep_the_entry_as_stale() -> None:
    source = Source(a="old")
    cache: KeyedCache[str, str] = KeyedCache(source)
    await cache.get("a")
    source.gate = asyncio.Event()
    reload = asyncio.ensure_future(cache.load("a"))
    await settle()
    source.values["a"] = "new"
    cache.invalidate("a", keep_entry=True)
    assert cache.peek("a") == "old"
    fresh = asyncio.ensure_future(cache.load("a"))  # does not join the outdated load
    await settle()
    source.release()
    assert (await reload, await fresh) == ("old", "new")
    assert cache.peek("a") == "new"
    cache.invalidate_all(keep_entries=True)
    assert list(cache.values()) == ["new"]
    assert source.loads == ["a", "a", "a"]


async def test_loader_errors_reach_every_waiter_and_are_not_cached() -> None:
    source = Source(a="A")
    cache: KeyedCache[str, str] = KeyedCache(source)
    source.gate = asyncio.Event()
    source.fail = ConnectionError("database down")
    waiting = [asyncio.ensure_future(cache.get("a")) for _ in range(5)]
    await settle()
    source.release()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert source.loads == ["a"]
    assert "a" not in cache
    source.gate = source.fail = None
    assert await cache.get("a") == "A"
    assert source.loads == ["a", "a"]


async def test_a_cancelled_caller_leaves_the_shared_load_running() -> None:
    source = Source(a="A")
    cache: KeyedCache[str, str] = KeyedCache(source)
    cancelled = await held_get(source, cache)
    other = asyncio.ensure_future(cache.get("a"))
    await cancel(cancelled)
    source.release()
    assert await other == "A"
    assert cache.peek("a") == "A"
    assert source.loads == ["a"]


async def test_a_failed_load_left_without_waiters_is_not_reported_as_unretrieved() -> None:
    source = Source()
    cache: KeyedCache[str, str] = KeyedCache(source)
    source.fail = ConnectionError("database down")
    with loop_errors() as seen:
        await cancel(await held_get(source, cache))
        source.release()
        await settle()
        gc.collect()
        await settle()
    assert seen == []
    assert "a" not in cache


async def test_the_oldest_entries_are_dropped_past_max_entries() -> None:
    source = Source()
    cache: KeyedCache[str, str] = KeyedCache(source, max_entries=3)
    for key in "abcd":
        await cache.get(key)
    assert ["a" in cache, "b" in cache, "c" in cache, "d" in cache] == [False, True, True, True]
    await cache.get("b")  # a hit does not make an entry newer (oldest stored first)
    await cache.get("e")
    assert sorted(k for k in "abcde" if k in cache) == ["c", "d", "e"]
    await cache.load("c")  # a reload does
    await cache.get("f")
    assert sorted(k for k in "abcdef" if k in cache) == ["c", "e", "f"]
    assert len(cache) == 3


async def test_a_weight_budget_drops_the_oldest_until_the_new_entry_fits() -> None:
    source = Source(a="x", b="x", c="x", heavy="xxxxxx", huge="x" * 12)
    cache: KeyedCache[str, str] = KeyedCache(source, weight=len, max_weight=8)
    for key in "abc":
        await cache.get(key)
    assert cache.weight == 3
    await cache.get("heavy")  # 3 + 6 > 8: the oldest made room
    assert (cache.weight, [k in cache for k in ("a", "b", "c", "heavy")]) == (
        8,
        [False, True, True, True],
    )
    cache.invalidate("heavy")
    assert cache.weight == 2
    await cache.get("huge")  # heavier than the whole budget: kept, alone
    assert (len(cache), cache.weight) == (1, 12)
    cache.invalidate_all()
    assert cache.weight == 0


async def test_replace_swaps_only_the_same_value_and_keeps_its_place() -> None:
    source = Source(a="aa", b="b")
    cache: KeyedCache[str, str] = KeyedCache(source, max_entries=2, weight=len)
    old = await cache.get("a")
    await cache.get("b")
    assert not cache.replace("a", "something else", "zzz")
    assert not cache.replace("missing", old, "zzz")
    assert cache.replace("a", old, "aaaa")
    assert (cache.peek("a"), cache.weight) == ("aaaa", 5)
    await cache.get("c")  # "a" is still the oldest
    assert ("a" in cache, "b" in cache, "c" in cache) == (False, True, True)


def test_bounds_must_be_positive() -> None:
    source = Source()
    with pytest.raises(ValueError, match="at least 1"):
        KeyedCache(source, max_entries=0)
    with pytest.raises(ValueError, match="at least 1"):
        KeyedCache(source, weight=len, max_weight=0)


async def test_stale_while_failing_serves_the_old_entry_and_retries_after_a_pause() -> None:
    now = [0.0]
    fail = [False]
    reads: list[str] = []

    async def load(key: str) -> str:
        reads.append(key)
        if fail[0]:
            raise ConnectionError("database down")
        return f"{key}@{len(reads)}"

    cache: KeyedCache[str, str] = KeyedCache(load)
    stale = StaleWhileFailing(cache, "things", clock=lambda: now[0], retry_seconds=5.0)
    fresh = [True]

    def is_fresh(_: str) -> bool:
        return fresh[0]

    assert await stale.current("a", is_fresh) == "a@1"
    assert await stale.current("a", is_fresh) == "a@1"  # fresh: no read
    fresh[0], fail[0] = False, True
    assert await stale.current("a", is_fresh) == "a@1"  # the read failed: served stale
    assert await stale.current("a", is_fresh) == "a@1"  # within the pause: no read
    assert len(reads) == 2
    now[0] = 5.1
    fail[0] = False
    assert await stale.current("a", is_fresh) == "a@3"
    fail[0] = True
    with pytest.raises(ConnectionError):  # never read: nothing to fall back on
        await stale.current("b", is_fresh)
