"""The quota gate on the memory store and on real Redis (db 15, a prefix per test).

Windows are crossed with a fake wall clock handed to the gate; the store's own TTLs
run on real time but outlast every test. Redis failures are real: a client pointed
at a closed port, and a redis-server of the test's own that is stopped and restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from app.domain.quotas.gate import (
    QuotaExceededError,
    QuotaGate,
    QuotaUnavailableError,
    plan_windows,
)
from app.domain.quotas.limits import UNLIMITED, QuotaLimits, QuotaLimitsCache, QuotaSync
from app.lib.events.base import EventBus
from app.lib.events.memory import MemoryEventBus
from app.lib.ports import free_port
from app.lib.redis_client import build_redis
from app.lib.state.base import MultiWindowDecision, StateStore, WindowLimit
from app.lib.state.memory import MemoryStateStore
from app.lib.state.redis import RedisStateStore
from tests.support.state_harness import Harness

CLOSED_PORT_URL = "redis://127.0.0.1:1/0"


def at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


class FakeClock:
    def __init__(self, start: str) -> None:
        self.now = at(start)

    def __call__(self) -> float:
        return self.now

    def set(self, text: str) -> None:
        self.now = at(text)


class Limits:
    """A limits loader backed by a dict, counting its reads."""

    def __init__(self) -> None:
        self.by_project: dict[UUID, QuotaLimits] = {}
        self.loads = 0
        self.fail = False

    async def __call__(self, project_id: UUID) -> QuotaLimits:
        self.loads += 1
        if self.fail:
            raise ConnectionError("database down")
        return self.by_project.get(project_id, UNLIMITED)

    def project(self, **limits: int | bool | None) -> UUID:
        project_id = uuid4()
        self.by_project[project_id] = QuotaLimits(**limits)  # type: ignore[arg-type]
        return project_id


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = Harness(request.param)
    yield h
    await h.cleanup()


@pytest.fixture
def limits() -> Limits:
    return Limits()


def gate_on(
    store: StateStore, limits: Limits, clock: FakeClock | None = None, **kwargs: object
) -> QuotaGate:
    cache = QuotaLimitsCache(limits)
    if clock is None:
        return QuotaGate(store, cache, **kwargs)  # type: ignore[arg-type]
    return QuotaGate(store, cache, clock=clock, **kwargs)  # type: ignore[arg-type]


async def outcome(gate: QuotaGate, project_id: UUID) -> str:
    try:
        await gate.check(project_id)
    except QuotaExceededError as exc:
        return exc.code
    return "admitted"


# ------------------------------------------------------------------ concurrency


@pytest.mark.parametrize("window", ["per_minute", "per_day", "per_month"])
async def test_fifty_parallel_requests_admit_exactly_twenty(
    harness: Harness, limits: Limits, window: str
) -> None:
    project_id = limits.project(**{window: 20})
    # Three replicas: on Redis, three clients racing for the same counters.
    gates = [gate_on(harness.state(), limits) for _ in range(3)]
    results = await asyncio.gather(*(outcome(gates[i % 3], project_id) for i in range(50)))
    assert results.count("admitted") == 20
    refused_code = "rate_limit_exceeded" if window == "per_minute" else "quota_exceeded"
    assert results.count(refused_code) == 30
    usage = await gates[0].usage(project_id, limits.by_project[project_id])
    # Refusals reserved nothing, in any window.
    assert [usage[w].used for w in ("minute", "day", "month")] == [20, 20, 20]


async def test_parallel_requests_respect_the_tightest_window(
    harness: Harness, limits: Limits
) -> None:
    project_id = limits.project(per_minute=30, per_day=12, per_month=100)
    gates = [gate_on(harness.state(), limits) for _ in range(3)]
    results = await asyncio.gather(*(outcome(gates[i % 3], project_id) for i in range(50)))
    assert results.count("admitted") == 12
    assert results.count("quota_exceeded") == 38


# ---------------------------------------------------------------- windows


async def test_minute_window_resets_and_retry_after(harness: Harness, limits: Limits) -> None:
    clock = FakeClock("2030-03-10T12:00:30.200")
    project_id = limits.project(per_minute=2)
    gate = gate_on(harness.state(), limits, clock)
    await gate.check(project_id)
    await gate.check(project_id)
    with pytest.raises(QuotaExceededError) as refused:
        await gate.check(project_id)
    exc = refused.value
    assert (exc.status_code, exc.code, exc.window, exc.limit) == (
        429,
        "rate_limit_exceeded",
        "minute",
        2,
    )
    # 29.8 s to the minute's end, rounded up to whole seconds.
    assert exc.headers == {"Retry-After": "30"}
    assert exc.body()["error"]["type"] == "rate_limit_error"

    clock.set("2030-03-10T12:00:59.990")
    with pytest.raises(QuotaExceededError) as late:
        await gate.check(project_id)
    assert late.value.headers["Retry-After"] == "1"

    clock.set("2030-03-10T12:01:00")
    await gate.check(project_id)
    await gate.check(project_id)
    assert await outcome(gate, project_id) == "rate_limit_exceeded"


async def test_day_window_is_the_utc_calendar_day(harness: Harness, limits: Limits) -> None:
    clock = FakeClock("2030-03-10T23:59:50")
    project_id = limits.project(per_day=1)
    gate = gate_on(harness.state(), limits, clock)
    await gate.check(project_id)
    with pytest.raises(QuotaExceededError) as refused:
        await gate.check(project_id)
    assert refused.value.code == "quota_exceeded"
    assert refused.value.window == "day"
    assert refused.value.headers["Retry-After"] == "10"
    assert "2030-03-11T00:00:00Z" in refused.value.message

    clock.set("2030-03-11T00:00:00")
    await gate.check(project_id)
    assert await outcome(gate, project_id) == "quota_exceeded"


async def test_month_window_is_the_utc_calendar_month(harness: Harness, limits: Limits) -> None:
    clock = FakeClock("2030-12-31T23:00:00")
    project_id = limits.project(per_month=1)
    gate = gate_on(harness.state(), limits, clock)
    await gate.check(project_id)
    with pytest.raises(QuotaExceededError) as refused:
        await gate.check(project_id)
    assert refused.value.window == "month"
    assert refused.value.headers["Retry-After"] == "3600"
    # The year rolls over with the month.
    clock.set("2031-01-01T00:00:00")
    await gate.check(project_id)
    clock.set("2031-01-31T23:59:59")
    assert await outcome(gate, project_id) == "quota_exceeded"
    clock.set("2031-02-01T00:00:01")
    await gate.check(project_id)


async def test_refusal_reports_the_window_resetting_last(harness: Harness, limits: Limits) -> None:
    clock = FakeClock("2030-03-10T23:59:30")
    project_id = limits.project(per_minute=1, per_day=1)
    gate = gate_on(harness.state(), limits, clock)
    await gate.check(project_id)
    # Both full: waiting for the minute alone would not help, the day decides.
    with pytest.raises(QuotaExceededError) as refused:
        await gate.check(project_id)
    assert (refused.value.window, refused.value.headers["Retry-After"]) == ("day", "30")
    # Earlier in the day the day window still decides, with its own reset.
    clock.set("2030-03-11T12:00:00")
    await gate.check(project_id)
    clock.set("2030-03-11T12:00:20")
    with pytest.raises(QuotaExceededError) as later:
        await gate.check(project_id)
    assert (later.value.window, later.value.headers["Retry-After"]) == ("day", str(12 * 3600 - 20))

    other = limits.project(per_minute=1, per_day=5)
    await gate.check(other)
    with pytest.raises(QuotaExceededError) as minute_only:
        await gate.check(other)
    assert minute_only.value.code == "rate_limit_exceeded"


async def test_zero_limit_refuses_everything(harness: Harness, limits: Limits) -> None:
    clock = FakeClock("2030-03-10T10:00:00")
    project_id = limits.project(per_month=0)
    gate = gate_on(harness.state(), limits, clock)
    assert await outcome(gate, project_id) == "quota_exceeded"
    usage = await gate.usage(project_id, limits.by_project[project_id])
    assert usage["month"].used == 0
    assert usage["month"].limit == 0
    assert usage["month"].resets_at == datetime.datetime(2030, 4, 1, tzinfo=datetime.UTC)


def test_plan_windows_keys_and_resets() -> None:
    project_id = UUID("00000000-0000-4000-8000-000000000001")
    plan = plan_windows(project_id, QuotaLimits(per_day=5), at("2030-02-28T13:45:12"))
    assert [w.name for w in plan] == ["minute", "day", "month"]
    assert [w.limit for w in plan] == [None, 5, None]
    tag = "{00000000-0000-4000-8000-000000000001}"
    assert plan[1].key == f"quota:{tag}:d:20300228"
    assert plan[2].key == f"quota:{tag}:mo:203002"
    assert plan[0].resets_at == at("2030-02-28T13:46:00")
    assert plan[1].resets_at == at("2030-03-01T00:00:00")
    assert plan[2].resets_at == at("2030-03-01T00:00:00")
    # Key TTLs outlive the bucket a little (clock skew between replicas).
    now = at("2030-02-28T13:45:12")
    assert plan[0].spec(now).ttl == pytest.approx(48 + 5)


# ------------------------------------------------------------ limits and costs


class CountingStore(MemoryStateStore):
    def __init__(self) -> None:
        super().__init__()
        self.admissions = 0

    async def admit_windows(
        self, windows: Sequence[WindowLimit], amount: int = 1
    ) -> MultiWindowDecision:
        self.admissions += 1
        return await super().admit_windows(windows, amount)


async def test_unlimited_project_costs_no_store_call(limits: Limits) -> None:
    store = CountingStore()
    gate = gate_on(store, limits)
    project_id = uuid4()
    for _ in range(10):
        await gate.check(project_id)
    assert store.admissions == 0
    assert len(store) == 0
    limited = limits.project(per_day=100)
    await gate.check(limited)
    assert store.admissions == 1
    # Windows without a limit are counted alongside the limited one.
    usage = await gate.usage(limited, limits.by_project[limited])
    assert [usage[w].used for w in ("minute", "day", "month")] == [1, 1, 1]


async def test_limits_are_read_once_then_served_from_memory(limits: Limits) -> None:
    gate = gate_on(MemoryStateStore(), limits)
    project_id = limits.project(per_day=1000)
    await asyncio.gather(*(gate.check(project_id) for _ in range(20)))
    for _ in range(20):
        await gate.check(project_id)
    assert limits.loads == 1

    limits.by_project[project_id] = QuotaLimits(per_day=0)
    await gate.check(project_id)  # still the cached limits
    gate.limits.invalidate(project_id)
    assert await outcome(gate, project_id) == "quota_exceeded"
    assert limits.loads == 2


async def test_cache_entries_expire_as_a_safety_net(limits: Limits) -> None:
    now = [0.0]
    cache = QuotaLimitsCache(limits, max_age=60, clock=lambda: now[0])
    project_id = limits.project(per_day=5)
    assert (await cache.get(project_id)).per_day == 5
    limits.by_project[project_id] = QuotaLimits(per_day=6)
    now[0] = 59.0
    assert (await cache.get(project_id)).per_day == 5
    now[0] = 61.0
    assert (await cache.get(project_id)).per_day == 6
    assert limits.loads == 2


async def test_a_read_overtaken_by_an_invalidation_is_not_cached() -> None:
    release = asyncio.Event()
    values = iter([QuotaLimits(per_day=1), QuotaLimits(per_day=2)])
    loads = 0

    async def slow_loader(_: UUID) -> QuotaLimits:
        nonlocal loads
        loads += 1
        value = next(values)
        if loads == 1:
            await release.wait()
        return value

    cache = QuotaLimitsCache(slow_loader)
    project_id = uuid4()
    first = asyncio.create_task(cache.get(project_id))
    await asyncio.sleep(0)
    cache.invalidate(project_id)  # the row changed while the first read was running
    second = await cache.get(project_id)  # does not join the outdated read
    release.set()
    assert (await first).per_day == 1
    assert second.per_day == 2
    assert (await cache.get(project_id)).per_day == 2
    assert loads == 2


async def test_database_failure_serves_stale_limits_or_refuses(limits: Limits) -> None:
    now = [0.0]
    cache = QuotaLimitsCache(limits, max_age=60, clock=lambda: now[0])
    known = limits.project(per_day=5)
    await cache.get(known)
    limits.fail = True
    now[0] = 100.0
    with capture_logs() as logs:
        assert (await cache.get(known)).per_day == 5
        # Retried after a few seconds, not on every request.
        assert (await cache.get(known)).per_day == 5
    assert limits.loads == 2
    assert [e["log_level"] for e in logs] == ["warning"]
    with pytest.raises(QuotaUnavailableError) as refused:
        await cache.get(uuid4())
    assert refused.value.status_code == 503
    assert refused.value.code == "quota_unavailable"
    assert refused.value.headers == {"Retry-After": "1"}


async def test_cache_is_bounded(limits: Limits) -> None:
    cache = QuotaLimitsCache(limits, max_projects=3)
    for _ in range(10):
        await cache.get(uuid4())
    assert len(cache) == 3


# ------------------------------------------------------ invalidation over the bus


@pytest.fixture(params=["memory", "redis"])
async def bus_pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[EventBus, EventBus]]:
    h = Harness(request.param)
    try:
        if request.param == "memory":
            shared = MemoryEventBus()
            yield shared, shared
            await shared.close()
        else:
            yield h.bus(), h.bus()
    finally:
        await h.cleanup()


async def test_quota_sync_invalidates_other_replicas(
    bus_pair: tuple[EventBus, EventBus], limits: Limits
) -> None:
    bus_a, bus_b = bus_pair
    sync_a = QuotaSync(QuotaLimitsCache(limits), bus_a)
    sync_b = QuotaSync(QuotaLimitsCache(limits), bus_b)
    project_id = limits.project(per_day=5)
    ready = asyncio.Event()
    follower = asyncio.create_task(sync_b.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        assert (await sync_a.cache.get(project_id)).per_day == 5
        assert (await sync_b.cache.get(project_id)).per_day == 5
        limits.by_project[project_id] = QuotaLimits(per_day=7)
        await sync_a.project_changed(project_id)
        assert (await sync_a.cache.get(project_id)).per_day == 7  # at once, locally

        async def seen_on_b() -> bool:
            return (await sync_b.cache.get(project_id)).per_day == 7

        for _ in range(200):
            if await seen_on_b():
                break
            await asyncio.sleep(0.01)
        assert await seen_on_b()
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


async def test_quota_sync_ignores_own_and_malformed_events(limits: Limits) -> None:
    sync = QuotaSync(QuotaLimitsCache(limits), MemoryEventBus())
    project_id = limits.project(per_day=5)
    await sync.cache.get(project_id)
    await sync.apply({"kind": "project", "projectId": str(project_id), "origin": sync.origin})
    with capture_logs() as logs:
        await sync.apply({"kind": "project", "projectId": "not-a-uuid"})
        await sync.apply({"kind": "other"})
    assert len(logs) == 2
    await sync.cache.get(project_id)
    assert limits.loads == 1
    await sync.apply({"kind": "project", "projectId": str(project_id), "origin": "elsewhere"})
    await sync.cache.get(project_id)
    assert limits.loads == 2


# --------------------------------------------------------- state store failures


async def test_fail_open_admits_when_redis_is_unreachable(limits: Limits) -> None:
    store = RedisStateStore.from_url(CLOSED_PORT_URL)
    registry = CollectorRegistry()
    gate = gate_on(store, limits, registry=registry)
    project_id = limits.project(per_minute=1)
    try:
        with capture_logs() as logs:
            for _ in range(5):
                await gate.check(project_id)  # admitted every time, uncounted
    finally:
        await store.close()
    assert gate.store_failures == 5
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1  # rate-limited: one line per interval
    assert "fail-open" in warnings[0]["event"]
    value = registry.get_sample_value("arona_quota_store_failures_total", {"policy": "fail_open"})
    assert value == 5


async def test_fail_closed_refuses_with_503_when_redis_is_unreachable(limits: Limits) -> None:
    store = RedisStateStore.from_url(CLOSED_PORT_URL)
    registry = CollectorRegistry()
    gate = gate_on(store, limits, registry=registry)
    project_id = limits.project(per_day=100, fail_closed=True)
    unlimited = uuid4()
    try:
        for _ in range(3):
            with pytest.raises(QuotaUnavailableError) as refused:
                await gate.check(project_id)
        # A project without limits never touches the store, whatever its state.
        await gate.check(unlimited)
        usage = await gate.usage(project_id, limits.by_project[project_id])
    finally:
        await store.close()
    exc = refused.value
    assert (exc.status_code, exc.code) == (503, "quota_unavailable")
    assert exc.headers == {"Retry-After": "5"}
    assert exc.body()["error"]["type"] == "api_error"
    assert (
        registry.get_sample_value("arona_quota_store_failures_total", {"policy": "fail_closed"})
        == 3
    )
    assert usage["day"].used is None
    assert usage["day"].limit == 100


class OwnRedis:
    """A redis-server this test starts, stops and restarts on one port."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for this test"
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.workdir),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        probe = build_redis(self.url)
        try:
            for _ in range(200):
                with contextlib.suppress(Exception):  # not accepting connections yet
                    if await probe.ping():
                        return
                assert self.process.returncode is None, "redis-server exited during start-up"
                await asyncio.sleep(0.025)
            raise AssertionError("redis-server did not start")
        finally:
            await probe.aclose()

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    try:
        yield server
    finally:
        await server.stop()


async def test_gate_survives_a_redis_restart(own_redis: OwnRedis, limits: Limits) -> None:
    await own_redis.start()
    store = RedisStateStore(build_redis(own_redis.url), prefix="quota-test:", owns_client=True)
    clock = FakeClock("2030-03-10T12:00:00")
    gate = gate_on(store, limits, clock)
    open_project = limits.project(per_minute=3)
    closed_project = limits.project(per_minute=3, fail_closed=True)
    try:
        await gate.check(open_project)
        await gate.check(closed_project)

        await own_redis.stop()
        await gate.check(open_project)  # fail-open: admitted while Redis is down
        with pytest.raises(QuotaUnavailableError):
            await gate.check(closed_project)
        assert gate.store_failures == 2

        await own_redis.start()
        # The restarted server is empty (no persistence) and has no scripts loaded:
        # the pool reconnects and the script is sent again.
        clock.set("2030-03-10T12:01:00")
        for project_id in (open_project, closed_project):
            for _ in range(3):
                await gate.check(project_id)
            assert await outcome(gate, project_id) == "rate_limit_exceeded"
        usage = await gate.usage(closed_project, limits.by_project[closed_project])
        assert usage["minute"].used == 3
        assert gate.store_failures == 2
    finally:
        await store.close()
