"""The in-memory API key index, its event sync and the batched last-used writer:
the races between database reads and concurrent changes, made deterministic."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID, uuid4

from app.domain.accounts.governance import KeyPolicy
from app.domain.accounts.keyring import ActiveApiKey, ApiKeyIndex
from app.domain.accounts.last_used import LastUsedRecorder
from app.domain.accounts.sync import ApiKeySync
from app.lib.events.memory import MemoryEventBus


def key() -> ActiveApiKey:
    return ActiveApiKey(key_id=uuid4(), project_id=uuid4())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowDatabase:
    """Loader and lookup that pause until released, to interleave changes."""

    def __init__(self, rows: dict[str, ActiveApiKey]) -> None:
        self.rows = rows
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.lookups = 0

    async def load_all(self) -> Iterable[tuple[str, ActiveApiKey]]:
        snapshot = list(self.rows.items())
        self.started.set()
        await self.release.wait()
        return snapshot

    async def lookup_one(self, key_hash: str) -> ActiveApiKey | None:
        self.lookups += 1
        found = self.rows.get(key_hash)
        self.started.set()
        await self.release.wait()
        return found


async def test_a_revocation_during_a_reload_is_not_undone() -> None:
    doomed, kept = key(), key()
    db = SlowDatabase({"doomed": doomed, "kept": kept})
    index = ApiKeyIndex(db.load_all, db.lookup_one)
    reload = asyncio.create_task(index.reload())
    await db.started.wait()  # the snapshot (with "doomed" active) is taken
    index.remove("doomed")
    added = key()
    index.add("new", added)
    db.release.set()
    await reload
    assert "doomed" not in index
    assert "kept" in index
    assert "new" in index


async def test_a_project_deleted_during_a_reload_stays_deleted() -> None:
    project = uuid4()
    first = ActiveApiKey(key_id=uuid4(), project_id=project)
    second = ActiveApiKey(key_id=uuid4(), project_id=project)
    other = key()
    db = SlowDatabase({"a": first, "b": second, "c": other})
    index = ApiKeyIndex(db.load_all, db.lookup_one)
    reload = asyncio.create_task(index.reload())
    await db.started.wait()
    index.remove_project(project)
    db.release.set()
    await reload
    assert "a" not in index
    assert "b" not in index
    assert "c" in index


async def test_a_miss_lookup_that_raced_a_revocation_is_not_cached() -> None:
    revoked = key()
    db = SlowDatabase({"k": revoked})
    index = ApiKeyIndex(db.load_all, db.lookup_one)
    lookup = asyncio.create_task(index.resolve("k"))
    await db.started.wait()  # read before the revocation committed
    index.remove("k")
    db.release.set()
    await lookup
    assert "k" not in index


async def test_a_miss_lookup_finds_a_key_it_missed_an_event_for() -> None:
    found = key()
    db = SlowDatabase({"k": found})
    db.release.set()
    index = ApiKeyIndex(db.load_all, db.lookup_one)
    assert await index.resolve("k") == found
    assert "k" in index
    assert await index.resolve("k") == found
    assert db.lookups == 1


async def test_unknown_hashes_cost_a_bounded_number_of_lookups() -> None:
    clock = FakeClock()
    db = SlowDatabase({})
    db.release.set()
    index = ApiKeyIndex(
        db.load_all, db.lookup_one, negative_ttl=5.0, miss_lookups_per_second=20.0, clock=clock
    )
    for i in range(500):
        assert await index.resolve(f"random-{i}") is None
    assert index.database_lookups == 20
    clock.now += 0.5
    for i in range(500, 1000):
        assert await index.resolve(f"random-{i}") is None
    assert index.database_lookups == 30

    # The same unknown hash is negatively cached for the TTL.
    clock.now += 10
    before = index.database_lookups
    for _ in range(50):
        assert await index.resolve("repeated") is None
    assert index.database_lookups == before + 1
    clock.now += 5.1
    assert await index.resolve("repeated") is None
    assert index.database_lookups == before + 2


async def test_an_added_key_clears_its_negative_cache_entry() -> None:
    clock = FakeClock()
    db = SlowDatabase({})
    db.release.set()
    index = ApiKeyIndex(db.load_all, db.lookup_one, clock=clock)
    assert await index.resolve("h") is None
    created = key()
    index.add("h", created)
    assert await index.resolve("h") == created


async def test_the_sync_loads_after_subscribing_so_no_event_is_lost() -> None:
    """A key revoked on another replica while this one loads its index at start-up."""
    bus = MemoryEventBus()
    doomed, kept = key(), key()
    index: ApiKeyIndex

    async def load_all() -> Iterable[tuple[str, ActiveApiKey]]:
        snapshot = [("doomed", doomed), ("kept", kept)]
        # Another replica revokes the key after our snapshot was read.
        await bus.publish("auth.api_keys", {"kind": "revoked", "hash": "doomed"})
        return snapshot

    async def lookup_one(_: str) -> ActiveApiKey | None:
        return None

    index = ApiKeyIndex(load_all, lookup_one)
    sync = ApiKeySync(index, bus)
    ready = asyncio.Event()
    task = asyncio.create_task(sync.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), 1)
        assert "kept" in index  # the sync task loaded the index itself
        for _ in range(10):
            await asyncio.sleep(0)
        assert "doomed" not in index
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close()


async def test_sync_applies_events_and_ignores_malformed_ones() -> None:
    bus = MemoryEventBus()
    index = ApiKeyIndex(_no_keys, _no_key)
    sync = ApiKeySync(index, bus)
    project = uuid4()
    sync.apply({"kind": "created", "hash": "h", "keyId": str(uuid4()), "projectId": str(project)})
    assert "h" in index
    sync.apply({"kind": "created", "hash": "x", "keyId": "not-a-uuid", "projectId": "1"})
    sync.apply({"kind": "revoked"})
    sync.apply({"kind": "unknown"})
    assert "x" not in index
    assert "h" in index
    sync.apply({"kind": "project_deleted", "projectId": str(project)})
    assert "h" not in index


async def _no_keys() -> Iterable[tuple[str, ActiveApiKey]]:
    return []


async def _no_key(_: str) -> ActiveApiKey | None:
    return None


class StuckEngine:
    """An engine whose transaction never completes (a flush cancelled mid-write)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[Any]:
        self.entered.set()
        await asyncio.Event().wait()
        yield None


async def test_a_flush_cancelled_mid_write_keeps_the_pending_uses() -> None:
    engine = StuckEngine()
    recorder = LastUsedRecorder(engine)  # type: ignore[arg-type]
    used: UUID = uuid4()
    recorder.touch(used)
    flush = asyncio.create_task(recorder.flush())
    await engine.entered.wait()
    assert recorder.pending == 0
    flush.cancel()
    await asyncio.gather(flush, return_exceptions=True)
    # Shutdown's final flush still has it.
    assert recorder.pending == 1


async def test_created_and_updated_events_read_the_key_with_its_limits() -> None:
    limited = ActiveApiKey(
        key_id=uuid4(), project_id=uuid4(), policy=KeyPolicy(rpm=5, expires_at=2000.0)
    )
    rows = {"h": limited}

    async def lookup_one(key_hash: str) -> ActiveApiKey | None:
        return rows.get(key_hash)

    index = ApiKeyIndex(_no_keys, lookup_one)
    sync = ApiKeySync(index, MemoryEventBus())
    # A new key from another replica is held with its row's limits, never bare.
    await sync.receive({"kind": "created", "hash": "h", "keyId": "x", "projectId": "y"})
    held = await index.resolve("h")
    assert held is not None
    assert held.policy.rpm == 5
    rows["h"] = ActiveApiKey(key_id=limited.key_id, project_id=limited.project_id)
    await sync.receive({"kind": "updated", "hash": "h"})
    held = await index.resolve("h")
    assert held is not None
    assert held.policy.rpm is None
    # An update of a key this replica does not hold reads nothing.
    await sync.receive({"kind": "updated", "hash": "unknown"})
    assert "unknown" not in index
    # A key gone from the database by the time the event is read leaves the index.
    del rows["h"]
    await sync.receive({"kind": "updated", "hash": "h"})
    assert "h" not in index
    await sync.receive({"kind": "updated"})  # malformed: ignored


async def test_an_update_racing_a_revocation_does_not_bring_the_key_back() -> None:
    db = SlowDatabase({"h": key()})
    index = ApiKeyIndex(_no_keys, db.lookup_one)
    index.add("h", db.rows["h"])
    refresh = asyncio.create_task(index.refresh("h"))
    await db.started.wait()  # the read saw the key still active
    index.remove("h")
    db.release.set()
    await refresh
    assert "h" not in index
