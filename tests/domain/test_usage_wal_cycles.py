"""The usage write-ahead group's Redis error path leaves nothing to the cyclic collector.

redis-py raises an error reply from a frame that still holds it in a local, so each
reply comes with a cycle (exception -> traceback -> frame -> exception) unless the
group breaks it. Creating the group answers BUSYGROUP on every start but the first,
and a real failure (here WRONGTYPE: the key holds a string) must not leave one either.
Real Redis; the writer's engine is never connected (creating the group is Redis only).
"""

from __future__ import annotations

import gc
import types
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.domain.usage.wal_group import StreamGroup
from app.domain.usage.writer import UsageWriter


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine("sqlite+aiosqlite://")
    yield engine
    await engine.dispose()


def _from_the_group(thing: object) -> bool:
    if isinstance(thing, types.FrameType):
        return "/app/domain/usage/" in thing.f_code.co_filename
    if isinstance(thing, ResponseError):
        return any(word in str(thing) for word in ("BUSYGROUP", "WRONGTYPE"))
    return False


def group_on(redis: Redis, engine: AsyncEngine, key: str) -> StreamGroup:
    return StreamGroup(
        redis, UsageWriter(engine), key=key, consumer="c1", claim_idle=5.0, max_entries=100
    )


async def test_creating_the_group_leaves_no_reference_cycle(
    redis: Redis, engine: AsyncEngine
) -> None:
    key = f"test:{uuid.uuid4().hex}:usage:wal"
    wrong = f"{key}:not-a-stream"
    await redis.set(wrong, "a string")
    existing, failing = group_on(redis, engine, key), group_on(redis, engine, wrong)

    async def create_both() -> None:
        await existing.ensure(recheck=True)  # BUSYGROUP after the first time: fine
        refused = False
        try:
            await failing.ensure()
        except ResponseError as exc:
            refused = "WRONGTYPE" in str(exc)
        assert refused

    try:
        await create_both()  # the first calls create what lives on (connections)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(10):
                await create_both()
            gc.collect()
            # Only the group's own garbage: other tests' background clients (redis-py's
            # own connection handshake, say) may leave cycles of their own meanwhile.
            ours = [o for o in gc.garbage if _from_the_group(o)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert ours == []
    finally:
        await redis.delete(key, wrong)
