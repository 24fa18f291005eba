"""``FallbackStateStore`` against a Redis of its own that is killed and started again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from app.lib.redis_client import build_redis
from app.lib.state.base import WindowLimit
from app.lib.state.fallback import FallbackStateStore, StateStoreUnavailableError
from app.lib.state.redis import RedisStateStore
from tests.support.redis_instance import RedisInstance

pytestmark = pytest.mark.faults


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def store(
    redis_server: RedisInstance, metrics: CollectorRegistry
) -> AsyncIterator[FallbackStateStore]:
    shared = RedisStateStore(build_redis(redis_server.url, socket_timeout=1.0), owns_client=True)
    fallback = FallbackStateStore(shared, retry_seconds=0.05, registry=metrics)
    watcher = asyncio.create_task(fallback.watch())
    try:
        yield fallback
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await fallback.close()


async def test_reads_and_writes_go_local_while_redis_is_down_and_back_after(
    store: FallbackStateStore, redis_server: RedisInstance, metrics: CollectorRegistry
) -> None:
    await store.set("pin", b"shared")
    assert await store.get("pin") == b"shared"
    redis_server.kill()
    # The first call finds Redis gone and is answered locally, as is every later one.
    assert await store.get("pin") is None
    assert store.degraded
    await store.set("pin", b"local", ttl=60)
    assert await store.get("pin") == b"local"
    assert await store.set_if_absent("lease", b"me", ttl=5)
    assert not await store.set_if_absent("lease", b"other", ttl=5)
    assert await store.incr("n", 2) == 2
    await store.push_sample("lat", 1.5, 10)
    assert await store.samples("lat") == [1.5]
    assert await store.exists("pin")
    assert await store.delete("pin")
    assert not await store.ping()
    assert metrics.get_sample_value("arona_state_store_degraded") == 1
    assert metrics.get_sample_value("arona_state_store_fallbacks_total") == 10

    redis_server.start()
    async with asyncio.timeout(5):
        await store.wait_recovered()
    assert not store.degraded
    assert metrics.get_sample_value("arona_state_store_degraded") == 0
    # Redis holds the cluster's view again (a fresh, empty server here); nothing from
    # the outage is kept or copied back.
    assert await store.get("lease") is None
    await store.set("pin", b"shared again")
    assert await store.shared.get("pin") == b"shared again"


async def test_quota_admission_never_falls_back_to_a_per_replica_count(
    store: FallbackStateStore, redis_server: RedisInstance
) -> None:
    windows = [WindowLimit("q:m", 10, 60.0)]
    assert (await store.admit_windows(windows)).allowed
    redis_server.kill()
    with pytest.raises(StateStoreUnavailableError):
        await store.admit_windows(windows)
    assert store.degraded
    redis_server.start()
    async with asyncio.timeout(5):
        await store.wait_recovered()
    assert (await store.admit_windows([WindowLimit("q:m", 10, 60.0)])).allowed


async def test_rate_limit_windows_count_locally_while_redis_is_down(
    store: FallbackStateStore, redis_server: RedisInstance
) -> None:
    """Login throttling (``admit``) keeps working on this replica's own count."""
    assert (await store.admit("login:x", 1, 2, 60.0)).allowed
    redis_server.kill()
    assert (await store.admit("login:x", 1, 2, 60.0)).allowed  # a fresh local window
    assert (await store.admit("login:x", 1, 2, 60.0)).allowed
    refused = await store.admit("login:x", 1, 2, 60.0)
    assert not refused.allowed
    assert refused.retry_after > 0
    assert store.degraded


async def test_hooks_run_once_on_the_way_down_and_once_on_the_way_back(
    store: FallbackStateStore, redis_server: RedisInstance
) -> None:
    phases: list[str] = []
    went_down = asyncio.Event()

    async def down() -> None:
        phases.append("down")
        went_down.set()
        # Writes made by the hook land in local memory (Redis is gone).
        await store.set("seeded", b"1")

    async def failing() -> None:
        raise RuntimeError("one re-sync failed")

    async def up() -> None:
        phases.append("up")

    store.on_degraded(down)
    store.on_recovered(failing)
    store.on_recovered(up)
    redis_server.kill()
    await store.get("anything")
    async with asyncio.timeout(5):
        await went_down.wait()
    assert await store.get("seeded") == b"1"
    for _ in range(5):
        await store.get("anything")
    assert phases == ["down"]
    redis_server.start()
    async with asyncio.timeout(5):
        await store.wait_recovered()
    assert phases == ["down", "up"]


async def test_local_answers_wait_for_the_seed(
    store: FallbackStateStore, redis_server: RedisInstance
) -> None:
    """A revocation mark lives in Redis; right after Redis goes, local memory is empty
    until the degraded hook copies the marks from the database. A read in between must
    not answer "not revoked": it waits for the seed."""
    release = asyncio.Event()

    async def seed() -> None:
        await release.wait()  # the database read, held open by the test
        await store.set("revoked:jti:t1", b"1", ttl=60)

    store.on_degraded(seed)
    await store.set("revoked:jti:t1", b"1", ttl=60)
    redis_server.kill()
    first = asyncio.create_task(store.exists("revoked:jti:t1"))
    later = asyncio.create_task(store.exists("revoked:jti:t1"))
    await asyncio.sleep(0.2)
    # Held, not answered from empty memory.
    assert not first.done()
    assert not later.done()
    release.set()
    async with asyncio.timeout(5):
        assert await first is True
        assert await later is True


async def test_a_seed_that_cannot_finish_does_not_hold_requests_forever(
    redis_server: RedisInstance, metrics: CollectorRegistry
) -> None:
    shared = RedisStateStore(build_redis(redis_server.url, socket_timeout=1.0), owns_client=True)
    store = FallbackStateStore(shared, retry_seconds=0.05, registry=metrics, seed_wait_seconds=0.2)
    never = asyncio.Event()

    async def stuck_seed() -> None:
        await never.wait()  # the database is down as well

    store.on_degraded(stuck_seed)
    watcher = asyncio.create_task(store.watch())
    try:
        redis_server.kill()
        async with asyncio.timeout(5):
            assert await store.get("pin") is None  # served from memory after the bound
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await store.close()
