"""``ReplicatedCache`` and ``CacheSync``: the one base of the per-area caches.

The replication tests run two "replicas" (a cache and a sync each) over the same
bus, in memory and on a real Redis server (``harness``), as two processes would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import pytest
from structlog.testing import capture_logs

from app.lib.events.base import EventBus
from app.lib.replicated_cache import CacheSync, ReplicatedCache, uuid_field
from tests.support.api import eventually
from tests.support.state_harness import Harness

CHANNEL = "things.changed"
WAIT = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Store:
    """The "database": values by key, reads counted, able to fail."""

    def __init__(self) -> None:
        self.values: dict[UUID, str] = {}
        self.reads = 0
        self.down = False

    async def load(self, key: UUID) -> str:
        self.reads += 1
        if self.down:
            raise ConnectionError("database down")
        return self.values.get(key, "nothing")


class ThingSync(CacheSync):
    def __init__(self, cache: ReplicatedCache[UUID, str], bus: EventBus) -> None:
        super().__init__(bus, CHANNEL, "thing", "things")
        self.cache = cache
        self.reloads = 0

    async def forget(self, key: UUID) -> None:
        self.cache.invalidate(key)

    async def reload(self) -> None:
        self.reloads += 1
        self.cache.mark_all_stale()


# ------------------------------------------------------------------ the local side


async def test_a_value_is_read_once_until_invalidated() -> None:
    store, key = Store(), uuid4()
    store.values[key] = "one"
    cache: ReplicatedCache[UUID, str] = ReplicatedCache(store.load, "things")
    assert await asyncio.gather(*(cache.get(key) for _ in range(5))) == ["one"] * 5
    assert store.reads == 1
    assert cache.is_current(key)

    store.values[key] = "two"
    cache.invalidate(key)
    assert not cache.is_current(key)
    assert cache.peek(key) is None
    assert await cache.get(key) == "two"
    assert store.reads == 2


async def test_entries_expire_after_max_age() -> None:
    store, key, clock = Store(), uuid4(), Clock()
    cache: ReplicatedCache[UUID, str] = ReplicatedCache(
        store.load, "things", max_age=60, clock=clock
    )
    await cache.get(key)
    clock.now = 59.0
    await cache.get(key)
    assert store.reads == 1
    clock.now = 61.0
    await cache.get(key)
    assert store.reads == 2


async def test_stale_entries_ride_out_a_failing_source() -> None:
    store, key, clock = Store(), uuid4(), Clock()
    store.values[key] = "kept"
    cache: ReplicatedCache[UUID, str] = ReplicatedCache(
        store.load, "things", clock=clock, retry_seconds=5.0
    )
    await cache.get(key)
    store.down = True
    cache.mark_all_stale()
    with capture_logs() as logs:
        assert await cache.get(key) == "kept"
        # One failed re-read, then a back-off: no read per request.
        assert await cache.get(key) == "kept"
    assert store.reads == 2
    assert [e["log_level"] for e in logs] == ["warning"]
    clock.now += 5.1
    assert await cache.get(key) == "kept"
    assert store.reads == 3

    # A key never read has nothing to fall back on.
    with pytest.raises(ConnectionError):
        await cache.get(uuid4())
    # Nor has one dropped by a change.
    cache.invalidate(key)
    with pytest.raises(ConnectionError):
        await cache.get(key)


async def test_kept_on_invalidate_a_changed_entry_is_only_a_fallback() -> None:
    store, key, clock = Store(), uuid4(), Clock()
    store.values[key] = "old"
    cache: ReplicatedCache[UUID, str] = ReplicatedCache(
        store.load, "things", keep_on_invalidate=True, clock=clock
    )
    await cache.get(key)
    store.values[key] = "new"
    cache.invalidate(key)
    assert cache.peek(key) == "old"
    assert await cache.get(key) == "new"  # read again at once
    store.down = True
    cache.invalidate(key)
    assert await cache.get(key) == "new"  # the re-read failed: the kept one


async def test_a_read_overtaken_by_an_invalidation_is_not_kept() -> None:
    release = asyncio.Event()
    answers = iter(["before", "after"])

    async def slow(_: UUID) -> str:
        value = next(answers)
        if value == "before":
            await release.wait()
        return value

    cache: ReplicatedCache[UUID, str] = ReplicatedCache(slow, "things")
    key = uuid4()
    first = asyncio.create_task(cache.get(key))
    await asyncio.sleep(0)
    cache.invalidate(key)
    assert await cache.get(key) == "after"
    release.set()
    assert await first == "before"
    assert await cache.get(key) == "after"


async def test_replace_keeps_the_entry_current_and_bounds_hold() -> None:
    store = Store()
    cache: ReplicatedCache[UUID, str] = ReplicatedCache(
        store.load, "things", max_entries=10, weight=len, max_weight=20
    )
    keys = [uuid4() for _ in range(4)]
    for key in keys:
        store.values[key] = "x" * 8
        await cache.get(key)
    assert len(cache) == 2
    assert cache.weight == 16
    old = await cache.get(keys[-1])
    assert cache.replace(keys[-1], old, "rebuilt")
    assert not cache.replace(keys[-1], old, "again")
    assert cache.is_current(keys[-1])
    assert await cache.get(keys[-1]) == "rebuilt"


def test_uuid_field() -> None:
    key = uuid4()
    assert uuid_field({"projectId": str(key)}, "projectId") == key
    assert uuid_field({"projectId": "nope"}, "projectId") is None
    assert uuid_field({"projectId": 3}, "projectId") is None
    assert uuid_field({}, "projectId") is None


# --------------------------------------------------------------- replication


@contextlib.asynccontextmanager
async def following(sync: ThingSync) -> AsyncIterator[None]:
    ready = asyncio.Event()
    task = asyncio.create_task(sync.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), WAIT)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually_read(cache: ReplicatedCache[UUID, str], key: UUID, wanted: str) -> None:
    async def seen() -> bool:
        return await cache.get(key) == wanted

    await eventually(seen, within=WAIT)


async def test_a_change_reaches_the_other_replica(harness: Harness) -> None:
    store, key = Store(), uuid4()
    store.values[key] = "one"
    a = ThingSync(ReplicatedCache(store.load, "things"), harness.bus())
    b = ThingSync(ReplicatedCache(store.load, "things"), harness.bus())
    async with following(a), following(b):
        assert b.reloads == 1  # subscribing reloads: events may have been missed
        assert await a.cache.get(key) == "one"
        assert await b.cache.get(key) == "one"
        store.values[key] = "two"
        await a.changed(key)
        assert not a.cache.is_current(key)  # at once on the writer
        assert await a.cache.get(key) == "two"
        await eventually_read(b.cache, key, "two")


async def test_own_and_malformed_events_are_skipped(harness: Harness) -> None:
    store, key = Store(), uuid4()
    sync = ThingSync(ReplicatedCache(store.load, "things"), harness.bus())
    await sync.cache.get(key)
    await sync.apply({"kind": "thing", "projectId": str(key), "origin": sync.origin})
    assert sync.cache.is_current(key)
    with capture_logs() as logs:
        await sync.apply({"kind": "thing", "projectId": "not-a-uuid"})
        await sync.apply({"kind": "other", "projectId": str(key)})
    assert sync.cache.is_current(key)
    assert [e["log_level"] for e in logs] == ["warning", "warning"]
    await sync.apply({"kind": "thing", "projectId": str(key), "origin": "elsewhere"})
    assert not sync.cache.is_current(key)


async def test_a_failed_publish_is_only_logged() -> None:
    class DeadBus:
        async def publish(self, channel: str, event: dict[str, object]) -> None:
            raise ConnectionError("bus down")

        def subscribe(self, *channels: str) -> contextlib.AbstractAsyncContextManager[None]:
            raise NotImplementedError

        async def close(self) -> None:
            return None

    store, key = Store(), uuid4()
    sync = ThingSync(ReplicatedCache(store.load, "things"), DeadBus())  # type: ignore[arg-type]
    await sync.cache.get(key)
    with capture_logs() as logs:
        await sync.changed(key)
    assert not sync.cache.is_current(key)
    assert [e["log_level"] for e in logs] == ["warning"]
