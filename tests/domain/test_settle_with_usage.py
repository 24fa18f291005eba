"""A metered call's settle and its usage entry share the app's script pipe: both
leave in one write to Redis, and both land (the settle in the windows, the entry in
the write-ahead stream), alone or with many calls ending together."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.domain.calls.metering import CallRecord, Meter
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.limits import QuotaLimitsCache
from app.domain.usage.recorder import UsageRecorder
from app.domain.usage.wal import UsageWal
from app.domain.usage.writer import UsageWriter
from app.lib.state.redis import RedisStateStore
from app.lib.state.script_pipe import ScriptPipe, StoreScripts
from app.routing.types import Usage
from tests.domain.test_quota_gate import Limits
from tests.domain.test_quota_reservations import reserve, used
from tests.domain.test_usage_wal import stream_of


class Wired:
    """The app's wiring of one replica: store and usage stream on one script pipe."""

    def __init__(self, redis: Redis, engine: AsyncEngine, limits: Limits) -> None:
        self.prefix = f"test:{uuid.uuid4().hex}:"
        self.wal_key = f"{self.prefix}usage:wal"
        self.scripts = StoreScripts(redis)
        assert self.scripts.pipe is not None
        self.pipe: ScriptPipe = self.scripts.pipe
        self.store = RedisStateStore(redis, prefix=self.prefix, scripts=self.scripts)
        self.gate = QuotaGate(self.store, QuotaLimitsCache(limits))
        writer = UsageWriter(engine, flush_interval=3600)
        self.wal = UsageWal(redis, writer, key=self.wal_key, scripts=self.scripts)
        self.meter = Meter(UsageRecorder(writer, self.wal), time.monotonic)

    async def close(self, redis: Redis) -> None:
        # The app's order: the usage stream, the store, then the pipe they share.
        await self.wal.close()
        await self.store.close()
        await self.scripts.close()
        keys = [k async for k in redis.scan_iter(match=self.prefix + "*")]
        if keys:
            await redis.delete(*keys)


@pytest.fixture
async def engine(pg_database: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(pg_database)
    yield engine
    await engine.dispose()


@pytest.fixture
async def wired(redis: Redis, engine: AsyncEngine) -> AsyncIterator[tuple[Wired, Limits]]:
    limits = Limits()
    w = Wired(redis, engine, limits)
    yield w, limits
    await w.close(redis)


def call_of(project_id: uuid.UUID, tokens: int) -> CallRecord:
    record = CallRecord(endpoint="chat", model_requested="m", project_id=project_id)
    record.usage = Usage(prompt_tokens=tokens - 2, completion_tokens=2)
    return record


async def reserved_call(w: Wired, limits: Limits) -> tuple[uuid.UUID, CallRecord]:
    """An admitted call holding 800 tokens of a 10,000-a-day project, that used 42."""
    project_id = limits.project(tokens_per_day=10_000)
    call = call_of(project_id, 42)
    call.hold = await reserve(w.gate, project_id, tokens=800)
    return project_id, call


async def test_a_settle_and_its_usage_entry_leave_in_one_write(
    wired: tuple[Wired, Limits], redis: Redis
) -> None:
    w, limits = wired
    project_id, call = await reserved_call(w, limits)
    writes, commands = w.pipe.stats.writes, w.pipe.stats.commands
    await w.meter.record(call)
    # The settle script and the append script, in one send(2).
    assert (w.pipe.stats.writes - writes, w.pipe.stats.commands - commands) == (1, 2)
    assert (await used(w.gate, limits, project_id))["tokens/day"] == 42
    [entry] = await stream_of(redis, w.wal_key)
    assert (entry.project_id, entry.total_tokens) == (project_id, 42)
    await w.store.close()
    assert not w.pipe.closed  # shared: the store leaves it to its owner


async def test_many_calls_ending_together_settle_and_land_in_few_writes(
    wired: tuple[Wired, Limits], redis: Redis
) -> None:
    w, limits = wired
    project_id = limits.project(tokens_per_day=100_000)
    calls = [call_of(project_id, 10 + i) for i in range(50)]
    for call in calls:
        call.hold = await reserve(w.gate, project_id, tokens=500)
    writes = w.pipe.stats.writes
    await asyncio.gather(*(w.meter.record(call) for call in calls))
    assert w.pipe.stats.writes - writes <= 3
    assert (await used(w.gate, limits, project_id))["tokens/day"] == sum(10 + i for i in range(50))
    entries = await stream_of(redis, w.wal_key)
    assert sorted(e.total_tokens for e in entries) == [10 + i for i in range(50)]


async def test_with_the_pipe_down_the_entry_is_kept_and_the_call_is_not_failed(
    wired: tuple[Wired, Limits], redis: Redis
) -> None:
    w, limits = wired
    _, call = await reserved_call(w, limits)
    await w.pipe.close()  # every later script call fails as Redis being away would
    await w.meter.record(call)  # never raises
    assert w.wal.fallbacks == 1  # the entry waits in memory for the stream to return
    assert w.gate.hold_failures.count == 1  # the settle failure is counted
