"""The usage write-ahead stream against real Redis and a real PostgreSQL database.

Consumers that "die" are real consumers of the real group that read entries and then
do nothing more; a refusing database is a renamed table; an unreachable Redis is a
redis-server of the test's own, stopped and started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.domain.usage.entry import UsageEntry
from app.domain.usage.recorder import UsageMetrics, UsageRecorder
from app.domain.usage.wal import UsageWal
from app.domain.usage.wal_group import FIELD, GROUP
from app.domain.usage.writer import UsageWriter
from app.lib.redis_client import build_redis
from app.lib.settings import Settings
from tests.domain.test_quota_gate import OwnRedis
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.gateway import ADMIN_TOKEN, GatewayEnv, open_env, unique
from tests.support.runtime import runtime_env
from tests.support.settings import AppFactory, with_settings
from tests.support.usage import FIELDS, count_of, entry, rename_usage_table, rows_of


@pytest.fixture
async def key(redis: Redis) -> AsyncIterator[str]:
    name = f"test:{uuid.uuid4().hex}:usage:wal"
    yield name
    await redis.delete(name)


@pytest.fixture
async def engine(pg_database: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(pg_database)
    yield engine
    await engine.dispose()


@pytest.fixture
async def fresh_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A database of the test's own: these tests rename its tables."""
    async with fresh_database("postgres", tmp_path) as settings:
        engine = create_async_engine(settings.database_url)
        yield engine
        await engine.dispose()


def wal_on(redis: Redis, engine: AsyncEngine, key: str, **options: Any) -> UsageWal:
    batch = options.pop("max_batch", 500)
    return UsageWal(
        redis, UsageWriter(engine, max_batch=batch, flush_interval=3600), key=key, **options
    )


async def stream_of(redis: Redis, key: str) -> list[UsageEntry]:
    """The entries in the stream, decoded, oldest first."""
    entries: Any = await redis.xrange(key)
    return [msgspec.msgpack.decode(fields[FIELD], type=UsageEntry) for _, fields in entries]


async def pending_on(redis: Redis, key: str) -> dict[str, int]:
    """Entries pending in the group, by consumer."""
    summary = await redis.xpending(key, GROUP)
    return {c["name"].decode(): int(c["pending"]) for c in summary["consumers"]}


async def test_an_entry_is_in_the_stream_when_append_returns_and_a_drain_writes_it(
    redis: Redis, engine: AsyncEngine, key: str
) -> None:
    wal = wal_on(redis, engine, key)
    tag = uuid.uuid4().hex
    item = entry(tag, 7, api_key_id=uuid.uuid4(), backend="gpu-1", streamed=True, ttft_ms=12)

    await wal.append(item)
    assert await stream_of(redis, key) == [item]
    assert await count_of(engine, tag) == 0  # the database only hears of it from a drain

    assert await wal.drain() == 1
    [row] = await rows_of(engine, tag)
    assert {name: row[name] for name in FIELDS} == {name: getattr(item, name) for name in FIELDS}
    assert await redis.xlen(key) == 0  # acknowledged and deleted
    assert await pending_on(redis, key) == {}
    assert (wal.appended, wal.fallbacks, wal.undecodable) == (1, 0, 0)


async def test_entries_recorded_together_share_one_round_trip(
    redis: Redis, engine: AsyncEngine, key: str
) -> None:
    wal = wal_on(redis, engine, key)
    tag = uuid.uuid4().hex
    items = [entry(tag, n) for n in range(300)]

    await asyncio.gather(*(wal.append(item) for item in items))
    # Every append queued before the first pipeline went out (asyncio runs ready tasks
    # in order), so one append call carried all of them; each caller waited for it.
    assert (wal.appended, wal.append_batches) == (300, 1)
    assert await redis.xlen(key) == 300

    assert await wal.drain_all() == 300
    assert {row["id"] for row in await rows_of(engine, tag)} == {item.id for item in items}


async def test_any_replica_drains_every_replicas_entries(
    redis: Redis, engine: AsyncEngine, key: str
) -> None:
    a, b = wal_on(redis, engine, key), wal_on(redis, engine, key)
    tag = uuid.uuid4().hex
    for n in range(20):
        await (a if n % 2 else b).append(entry(tag, n))

    assert await a.drain_all() == 20
    assert await count_of(engine, tag) == 20
    assert await redis.xlen(key) == 0
    # b's own entries were written by a: b's next drain stops tracking them.
    assert b.unconfirmed == 10
    assert await b.drain() == 0
    assert b.unconfirmed == 0


async def test_entries_pending_on_a_dead_consumer_are_taken_over_and_written_once(
    redis: Redis, engine: AsyncEngine, key: str
) -> None:
    dead = wal_on(redis, engine, key)
    tag = uuid.uuid4().hex
    items = [entry(tag, n) for n in range(30)]
    for item in items:
        await dead.append(item)
    # The dead replica read every entry and inserted half of them, then was killed
    # before acknowledging anything.
    await redis.xgroup_create(key, GROUP, id="0", mkstream=True)
    reply: Any = await redis.xreadgroup(GROUP, dead.consumer, {key: ">"}, count=100)
    assert len(reply[0][1]) == 30
    await UsageWriter(engine).write(items[:15])

    patient = wal_on(redis, engine, key, claim_idle=3600)
    assert await patient.drain() == 0  # not idle long enough to be taken over
    assert await pending_on(redis, key) == {dead.consumer: 30}

    survivor = wal_on(redis, engine, key, claim_idle=0.05)
    await asyncio.sleep(0.1)
    with structlog.testing.capture_logs() as logs:
        assert await survivor.drain() == 30  # 15 of them already there: skipped
    assert any("taken over" in line["event"] for line in logs)
    assert {row["id"] for row in await rows_of(engine, tag)} == {item.id for item in items}
    assert await count_of(engine, tag) == 30
    assert await redis.xlen(key) == 0
    assert await pending_on(redis, key) == {}


async def test_while_the_database_refuses_entries_wait_in_the_stream(
    redis: Redis, fresh_engine: AsyncEngine, key: str
) -> None:
    wal = wal_on(redis, fresh_engine, key, max_batch=10)
    tag = uuid.uuid4().hex
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    for n in range(40):
        await wal.append(entry(tag, n))  # the tenth starts a drain, which fails

    for _ in range(2):
        with pytest.raises(DBAPIError):
            await wal.drain()
        # One batch read and held; the rest never delivered; nothing lost.
        assert await redis.xlen(key) == 40
        assert await pending_on(redis, key) == {wal.consumer: 10}

    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")
    assert await wal.drain_all() == 40
    rows = await rows_of(fresh_engine, tag)
    assert sorted(row["prompt_tokens"] for row in rows) == list(range(40))
    assert await redis.xlen(key) == 0


async def test_the_stream_is_bounded_and_what_trimming_removes_counts_as_dropped(
    redis: Redis, fresh_engine: AsyncEngine, key: str
) -> None:
    writer = UsageWriter(fresh_engine, max_batch=50, flush_interval=3600)
    wal = UsageWal(redis, writer, key=key, max_entries=100)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(UsageMetrics(writer, wal))
    tag = uuid.uuid4().hex
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    with structlog.testing.capture_logs() as logs:
        # 1000 at once: past the batch size, so a drain starts (and fails) by itself.
        await asyncio.gather(*(wal.append(entry(tag, n)) for n in range(1000)))
        with pytest.raises(DBAPIError):
            await wal.drain()
    left = await redis.xlen(key)
    # Approximate trimming removes whole nodes (100 entries each by default): the
    # stream keeps at least its bound and about no more.
    assert 100 <= left <= 200
    assert wal.trimmed == 1000 - left
    assert wal.length == left
    assert registry.get_sample_value("arona_usage_dropped_total", {"reason": "wal_trimmed"}) == (
        1000 - left
    )
    [warning] = [line for line in logs if "stream is full" in line["event"]]
    assert warning["log_level"] == "warning"

    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")
    # The batch held when the database refused was among the oldest, trimmed since:
    # acknowledged without a row. The newest entries are the ones kept.
    assert await wal.drain_all() == left
    rows = await rows_of(fresh_engine, tag)
    assert sorted(row["prompt_tokens"] for row in rows) == list(range(1000 - left, 1000))
    assert await pending_on(redis, key) == {}


async def test_an_undecodable_entry_is_discarded_counted_and_logged(
    redis: Redis, engine: AsyncEngine, key: str
) -> None:
    wal = wal_on(redis, engine, key)
    tag = uuid.uuid4().hex
    await wal.append(entry(tag, 1))
    await redis.xadd(key, {FIELD: b"\x93not a usage entry"})
    await wal.append(entry(tag, 2))

    with structlog.testing.capture_logs() as logs:
        assert await wal.drain() == 2
    assert wal.undecodable == 1
    assert any("undecodable" in line["event"] for line in logs)
    assert await count_of(engine, tag) == 2
    assert await redis.xlen(key) == 0


async def test_a_graceful_stop_writes_its_own_entries_and_leaves_the_others(
    redis: Redis, engine: AsyncEngine, key: str
) -> None:
    a, b = wal_on(redis, engine, key), wal_on(redis, engine, key)
    tag_a, tag_b = uuid.uuid4().hex, uuid.uuid4().hex
    for n in range(10):
        await a.append(entry(tag_a, n))
    for n in range(7):
        await b.append(entry(tag_b, n))

    await a.close()
    assert await count_of(engine, tag_a) == 10
    assert await count_of(engine, tag_b) == 0  # b's entries are left to the group
    assert await redis.xlen(key) == 7
    await b.close()
    assert await count_of(engine, tag_b) == 7
    assert await redis.xlen(key) == 0
    assert await redis.xinfo_consumers(key, GROUP) == []  # both left the group


async def test_a_graceful_stop_writes_what_is_pending_on_it(
    redis: Redis, fresh_engine: AsyncEngine, key: str
) -> None:
    a = wal_on(redis, fresh_engine, key, max_batch=10)
    b = wal_on(redis, fresh_engine, key)  # far from its batch size: b never drains
    tag = uuid.uuid4().hex
    for n in range(10):
        await b.append(entry(tag, n))
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    with pytest.raises(DBAPIError):
        await a.drain()  # a holds b's ten entries, unwritten
    assert await pending_on(redis, key) == {a.consumer: 10}
    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")

    await a.close()
    assert await count_of(fresh_engine, tag) == 10
    assert await redis.xlen(key) == 0
    assert b.unconfirmed == 10  # b does not know yet; its own stop would skip them
    await b.close()
    assert await count_of(fresh_engine, tag) == 10


async def test_without_redis_entries_go_to_memory_and_back_to_the_stream_after(
    tmp_path: Path, engine: AsyncEngine
) -> None:
    own = OwnRedis(tmp_path)
    await own.start()
    redis = build_redis(own.url)
    writer = UsageWriter(engine, flush_interval=3600)
    wal = UsageWal(redis, writer, key="usage:wal", retry_seconds=0.05)
    recorder = UsageRecorder(writer, wal)
    tag = uuid.uuid4().hex
    try:
        for n in range(3):
            await recorder.record(entry(tag, n))
        assert await recorder.flush() == 3

        await own.stop()
        with structlog.testing.capture_logs() as logs:
            for n in range(3, 8):
                await recorder.record(entry(tag, n))
        assert not wal.available
        assert (wal.fallbacks, recorder.pending) == (5, 5)
        assert any("unavailable" in line["event"] for line in logs)

        await own.start()  # empty: this one keeps nothing on disk

        async def back() -> bool:
            return wal.available

        await eventually(back, within=10)
        for n in range(8, 10):
            await recorder.record(entry(tag, n))
        assert (wal.fallbacks, recorder.pending, await redis.xlen("usage:wal")) == (5, 5, 2)
        # The memory buffer and the stream (its group lost with the old server's data).
        assert await recorder.flush() == 7
        rows = await rows_of(engine, tag)
        assert sorted(row["prompt_tokens"] for row in rows) == list(range(10))
    finally:
        await redis.aclose()
        await own.stop()


# -- through the gateway and the runtime API -----------------------------------------

PAUSE_MS = 1500
"""Long against the rest of a stream, short against the client's timeouts."""
CHUNK_DELAY_SECONDS = 0.05


@dataclass
class Live:
    env: GatewayEnv
    control: Redis
    """A client of the app's own Redis, to pause its writes and read the stream."""

    async def pause_writes(self) -> None:
        # Reads still answer; every write (the record's XADD included) waits.
        await self.control.client_pause(PAUSE_MS, all=False)

    async def recorded(self) -> list[UsageEntry]:
        return await stream_of(self.control, f"{self.env.settings.redis_prefix}usage:wal")


@pytest.fixture
async def live(tmp_path: Path, pg_settings: Settings, make_app: AppFactory) -> AsyncIterator[Live]:
    """A live app on a Redis of the test's own (it is paused) with no timed drain:
    whatever is in the stream was put there by the call itself."""
    own = OwnRedis(tmp_path)
    await own.start()
    control = build_redis(own.url)
    settings = with_settings(
        pg_settings, redis_url=own.url, usage_flush_seconds=3600.0, admin_token=ADMIN_TOKEN
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            yield Live(await open_env(settings, make_app, stack), control)
    finally:
        await control.aclose()
        await own.stop()


async def test_a_completed_call_is_in_the_stream_before_its_answer(live: Live) -> None:
    fake, url = await live.env.fake(models=[unique("model")])
    await live.env.register(unique("b"), url)
    conversation = uuid.uuid4().hex
    async with live.env.sdk() as sdk:
        await live.pause_writes()
        await sdk.chat.completions.create(
            model=fake.control.models[0],
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"conversation_id": conversation},
        )
        [recorded] = await live.recorded()
    assert (recorded.conversation_id, recorded.status, recorded.streamed) == (
        conversation,
        200,
        False,
    )


async def test_a_stream_is_in_the_stream_before_its_done_frame(live: Live) -> None:
    fake, url = await live.env.fake(models=[unique("model")], chunks=5)
    # The stream must still be running when the pause starts (a whole answer in one
    # read would be relayed, and recorded, before the client saw its first frame).
    fake.control.chunk_delay_seconds = CHUNK_DELAY_SECONDS
    await live.env.register(unique("b"), url)
    conversation = uuid.uuid4().hex
    paused = False
    seen_at_done: list[UsageEntry] | None = None
    async with (
        live.env.sdk() as sdk,
        sdk.chat.completions.with_streaming_response.create(
            model=fake.control.models[0],
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"conversation_id": conversation},
        ) as response,
    ):
        async for line in response.iter_lines():
            if not paused and '"content"' in line:
                # From here the record's append waits for the pause: [DONE] must too.
                await live.pause_writes()
                paused = True
            if line == "data: [DONE]":
                seen_at_done = await live.recorded()
    assert paused, "no content frame"
    assert seen_at_done is not None, "no [DONE] frame"
    [recorded] = seen_at_done
    assert (recorded.conversation_id, recorded.status, recorded.streamed) == (
        conversation,
        200,
        True,
    )
    assert recorded.total_tokens > 0


async def test_a_runtime_stream_is_in_the_stream_before_its_done_frame(live: Live) -> None:
    rt = await runtime_env(live.env)
    model = unique("model")
    [(_, fake)] = await rt.pool(model, [[]])
    fake.control.chunk_delay_seconds = CHUNK_DELAY_SECONDS
    profile = await rt.profile(model)
    conversation = await rt.conversation(modelProfileId=profile)
    paused = False
    seen_at_done: list[UsageEntry] | None = None
    body = {"conversationId": conversation, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with rt.http.stream(
            "POST", "/api/runtime/chat", json=body, headers=rt.headers
        ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not paused and '"content"' in line:
                    await live.pause_writes()
                    paused = True
                if line == "data: [DONE]":
                    seen_at_done = await live.recorded()
    finally:
        await rt.cleanup()
    assert paused, "no content frame"
    assert seen_at_done is not None, "no [DONE] frame"
    [recorded] = seen_at_done
    assert (recorded.conversation_id, recorded.status, recorded.model_profile_id) == (
        conversation,
        200,
        profile,
    )
    assert recorded.total_tokens > 0
