"""The batched usage writer against real databases (PostgreSQL and SQLite).

Failures are real too: the table is renamed away under the writer, so the INSERT
fails in the database, not in a mock.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import CollectorRegistry
from sqlalchemy import delete, insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from app.db.config import install_sqlite_pragmas
from app.db.models import Project, User
from app.domain.usage.recorder import UsageMetrics
from app.domain.usage.writer import UsageWriter
from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings
from tests.support.usage import FIELDS, count_of, entry, rename_usage_table, rows_of


@pytest.fixture(params=["postgres", "sqlite"])
async def engine(
    request: pytest.FixtureRequest, pg_database: str, sqlite_database: str
) -> AsyncIterator[AsyncEngine]:
    url = pg_database if request.param == "postgres" else sqlite_database
    engine = create_async_engine(url)
    install_sqlite_pragmas(engine)
    yield engine
    await engine.dispose()


@pytest.fixture(params=["postgres", "sqlite"])
async def fresh_engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[AsyncEngine]:
    """A database of the test's own: these tests rename its tables."""
    async with fresh_database(request.param, tmp_path) as settings:
        engine = create_async_engine(settings.database_url)
        install_sqlite_pragmas(engine)
        yield engine
        await engine.dispose()


async def test_every_recorded_entry_becomes_one_row_with_exact_values(engine: AsyncEngine):
    tag = uuid.uuid4().hex
    moment = datetime.datetime(2026, 11, 29, 12, 30, 45, 123456, tzinfo=datetime.UTC)
    full = entry(
        tag,
        7,
        api_key_id=uuid.uuid4(),
        user_id=uuid.uuid4(),
        model_served="served-model:latest",
        backend="gpu-1",
        endpoint="embeddings",
        streamed=True,
        estimated=True,
        status=502,
        error_code="bad_gateway",
        latency_ms=1234,
        ttft_ms=56,
        created_at=moment,
    )
    plain = [entry(tag, n) for n in range(1, 250)]
    writer = UsageWriter(engine, max_batch=1000)
    for item in [full, *plain]:
        writer.record(item)
    assert writer.pending == 250
    assert await count_of(engine, tag) == 0  # nothing written before a flush

    assert await writer.flush() == 250
    assert writer.pending == 0
    stored = {row["id"]: row for row in await rows_of(engine, tag)}
    assert len(stored) == 250
    for item in [full, *plain]:
        row = stored[item.id]
        assert {name: row[name] for name in FIELDS} == {
            name: getattr(item, name) for name in FIELDS
        }
    assert stored[full.id]["created_at"] == moment
    assert stored[full.id]["project_id"] is None


async def test_flush_with_nothing_buffered_writes_nothing(engine: AsyncEngine):
    assert await UsageWriter(engine).flush() == 0


async def test_reaching_max_batch_flushes_without_being_asked(engine: AsyncEngine):
    tag = uuid.uuid4().hex
    writer = UsageWriter(engine, max_batch=10, flush_interval=3600)
    for n in range(9):
        writer.record(entry(tag, n))
    await asyncio.sleep(0.2)
    assert await count_of(engine, tag) == 0  # below the batch size: waits for the interval

    writer.record(entry(tag, 9))  # the tenth: record() returns at once, the flush follows

    async def written() -> bool:
        return await count_of(engine, tag) == 10

    await eventually(written, within=5)
    assert writer.pending == 0
    await writer.close()


async def test_the_interval_flushes_and_close_writes_the_rest(engine: AsyncEngine):
    tag = uuid.uuid4().hex
    writer = UsageWriter(engine, max_batch=1000, flush_interval=0.05)
    task = asyncio.create_task(writer.run())
    try:
        writer.record(entry(tag, 1))

        async def written() -> bool:
            return await count_of(engine, tag) == 1

        await eventually(written, within=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    for n in range(2, 6):
        writer.record(entry(tag, n))
    await writer.close()
    assert await count_of(engine, tag) == 5


async def test_a_session_factory_works_as_the_target(engine: AsyncEngine):
    tag = uuid.uuid4().hex
    writer = UsageWriter(async_sessionmaker(engine, expire_on_commit=False))
    for n in range(3):
        writer.record(entry(tag, n))
    assert await writer.flush() == 3
    assert await count_of(engine, tag) == 3


async def test_a_failed_flush_keeps_the_rows_and_a_later_one_writes_them(
    fresh_engine: AsyncEngine,
):
    tag = uuid.uuid4().hex
    writer = UsageWriter(fresh_engine, max_batch=100, flush_interval=3600)
    first = [entry(tag, n) for n in range(5)]
    for item in first:
        writer.record(item)
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    with pytest.raises(DBAPIError):
        await writer.flush()
    assert writer.pending == 5

    later = [entry(tag, n) for n in range(5, 8)]
    for item in later:
        writer.record(item)
    with pytest.raises(DBAPIError):
        await writer.flush()
    assert writer.pending == 8

    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")
    assert await writer.flush() == 8
    assert writer.pending == 0
    rows = await rows_of(fresh_engine, tag)
    assert sorted(row["prompt_tokens"] for row in rows) == list(range(8))
    assert {row["id"] for row in rows} == {item.id for item in first + later}
    assert writer.dropped == 0


async def test_the_buffer_is_bounded_while_the_database_refuses(fresh_engine: AsyncEngine):
    tag = uuid.uuid4().hex
    writer = UsageWriter(fresh_engine, max_batch=2, max_buffered=4, flush_interval=3600)
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    entries = [entry(tag, n) for n in range(6)]
    for item in entries:
        writer.record(item)  # the size trigger fires (and fails) in the background
    assert writer.pending == 4
    assert writer.dropped == 2
    with pytest.raises(DBAPIError):
        await writer.flush()
    assert writer.pending == 4

    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")
    await writer.close()
    rows = await rows_of(fresh_engine, tag)
    # The newest are kept: the oldest are the ones refused for longest.
    assert sorted(row["prompt_tokens"] for row in rows) == [2, 3, 4, 5]
    assert writer.dropped == 2


async def test_a_retried_batch_is_not_written_twice(engine: AsyncEngine):
    """A batch whose commit went through but whose answer was lost is retried
    with the same row ids; the duplicates are skipped."""
    tag = uuid.uuid4().hex
    writer = UsageWriter(engine)
    items = [entry(tag, n) for n in range(4)]
    for item in items:
        writer.record(item)
    await writer.flush()
    for item in items:
        writer.record(item)  # the same entries (same ids) once more
    writer.record(entry(tag, 99))
    assert await writer.flush() == 5
    assert await count_of(engine, tag) == 5


async def test_usage_of_a_project_deleted_before_the_flush_is_kept_detached(
    engine: AsyncEngine,
):
    tag = uuid.uuid4().hex
    user_id, kept_id, gone_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = datetime.datetime.now(datetime.UTC)
    async with engine.begin() as connection:
        await connection.execute(
            insert(User).values(
                id=user_id,
                email=f"{tag}@example.com",
                name="",
                password_hash="x",
                is_admin=False,
                disabled=False,
                created_at=now,
                updated_at=now,
            )
        )
        for project_id in (kept_id, gone_id):
            await connection.execute(
                insert(Project).values(
                    id=project_id,
                    name="p",
                    slug=f"p-{project_id.hex}",
                    owner_id=user_id,
                    created_at=now,
                    updated_at=now,
                )
            )
    writer = UsageWriter(engine)
    writer.record(entry(tag, 1, project_id=kept_id))
    writer.record(entry(tag, 2, project_id=gone_id))
    async with engine.begin() as connection:
        await connection.execute(delete(Project).where(Project.id == gone_id))
    assert await writer.flush() == 2
    by_tokens = {row["prompt_tokens"]: row for row in await rows_of(engine, tag)}
    assert by_tokens[1]["project_id"] == kept_id
    assert by_tokens[2]["project_id"] is None

    # Deleting a project later detaches its usage the same way (ON DELETE SET NULL).
    async with engine.begin() as connection:
        await connection.execute(delete(Project).where(Project.id == kept_id))
    assert all(row["project_id"] is None for row in await rows_of(engine, tag))


async def test_over_long_strings_are_cut_to_the_column_not_refused(engine: AsyncEngine):
    tag = uuid.uuid4().hex
    writer = UsageWriter(engine)
    writer.record(entry(tag, 1, model_requested="m" * 500, error_code="e" * 100))
    assert await writer.flush() == 1
    [row] = await rows_of(engine, tag)
    assert row["model_requested"] == "m" * 200
    assert row["error_code"] == "e" * 64


async def test_nul_characters_and_huge_counts_are_made_to_fit_not_refused(engine: AsyncEngine):
    """PostgreSQL refuses NUL in text and INTEGER past 2**31: either would fail the
    batch on every retry (a client chooses the model name, an upstream the counts)."""
    tag = uuid.uuid4().hex
    writer = UsageWriter(engine)
    writer.record(entry(tag, 1, model_requested="gpt\x00-4", prompt_tokens=2**40))
    writer.record(entry(tag, 2, total_tokens=-(2**40), ttft_ms=None))
    assert await writer.flush() == 2
    by_n = {row["completion_tokens"] // 2: row for row in await rows_of(engine, tag)}
    assert by_n[1]["model_requested"] == "gpt-4"
    assert by_n[1]["prompt_tokens"] == 2**31 - 1
    assert by_n[2]["total_tokens"] == -(2**31)
    assert by_n[2]["ttft_ms"] is None


@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
async def test_a_row_the_database_refuses_is_dropped_alone_not_blocking_the_rest(
    engine: AsyncEngine,
) -> None:
    """A cost past NUMERIC(18, 6) is refused by PostgreSQL (SQLite stores anything):
    the batch is written row by row, the refused row is counted and logged, and every
    other row, in this batch and after it, is written."""
    tag = uuid.uuid4().hex
    writer = UsageWriter(engine)
    writer.record(entry(tag, 1))
    writer.record(entry(tag, 2, cost=1e15))
    writer.record(entry(tag, 3))
    with structlog.testing.capture_logs() as logs:
        assert await writer.flush() == 2
    assert sorted(row["completion_tokens"] // 2 for row in await rows_of(engine, tag)) == [1, 3]
    assert writer.rejected == 1
    assert writer.pending == 0
    assert [e["event"] for e in logs] == ["usage record refused by the database and dropped"]
    writer.record(entry(tag, 4))
    assert await writer.flush() == 1
    # The stream's drain takes the same path.
    await writer.write([entry(tag, 5, cost=1e15), entry(tag, 6)])
    assert sorted(row["completion_tokens"] // 2 for row in await rows_of(engine, tag)) == [
        1,
        3,
        4,
        6,
    ]
    assert writer.rejected == 2


def test_invalid_sizes_are_refused():
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(ValueError, match="max_batch"):
        UsageWriter(engine, max_batch=0)
    with pytest.raises(ValueError, match="flush_interval"):
        UsageWriter(engine, flush_interval=0)
    with pytest.raises(ValueError, match="max_buffered"):
        UsageWriter(engine, max_batch=10, max_buffered=5)


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_a_graceful_stop_of_the_app_writes_what_is_buffered(
    kind: str, pg_settings: Settings, sqlite_settings: Settings, make_app: AppFactory
):
    settings = pg_settings if kind == "postgres" else sqlite_settings
    # The interval is never reached: only the shutdown flush can write these.
    settings = with_settings(settings, usage_flush_seconds=3600.0)
    tag = uuid.uuid4().hex
    app = make_app(settings)
    # In the test's own loop (AsyncTestClient serves from a thread of its own): the
    # recorder's Redis connections belong to the app's loop.
    async with live_server(app):
        recorder = app.state.resources.usage_writer
        for n in range(3):
            await recorder.record(entry(tag, n))
        if kind == "postgres":  # with Redis: in the write-ahead stream, not in memory
            assert recorder.wal is not None
            assert (recorder.wal.appended, recorder.pending) == (3, 0)
        else:
            assert (recorder.wal, recorder.pending) == (None, 3)
    engine = create_async_engine(settings.database_url)
    try:
        assert await count_of(engine, tag) == 3
    finally:
        await engine.dispose()


async def test_while_the_database_refuses_traffic_does_not_trigger_retries(
    fresh_engine: AsyncEngine,
):
    attempts: list[int] = []
    tag = uuid.uuid4().hex
    writer = UsageWriter(fresh_engine, max_batch=2, flush_interval=3600)
    # Count insert attempts at the writer's own seam: on PostgreSQL the rows go through
    # asyncpg directly, so SQLAlchemy's cursor events never see them.
    insert = writer._insert

    async def counting_insert(connection: Any, rows: list[dict[str, Any]]) -> None:
        attempts.append(len(rows))
        await insert(connection, rows)

    writer._insert = counting_insert  # type: ignore[method-assign]
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    for n in range(2):
        writer.record(entry(tag, n))  # reaches max_batch: one flush is tried, and fails

    async def tried() -> bool:
        return len(attempts) == 1 and writer._size_flush is not None and writer._size_flush.done()

    await eventually(tried, within=5)
    for n in range(2, 20):
        writer.record(entry(tag, n))
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    assert len(attempts) == 1  # the next try waits for the interval
    assert writer.pending == 20

    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")
    assert await writer.flush() == 20
    assert await count_of(fresh_engine, tag) == 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_drops_are_logged_at_most_once_per_interval_with_the_count_since():
    clock = FakeClock()
    # No event loop runs here, so no flush is attempted: only the bound acts.
    writer = UsageWriter(
        create_async_engine("sqlite+aiosqlite://"),
        max_batch=2,
        max_buffered=3,
        log_interval=60.0,
        clock=clock,
    )
    with structlog.testing.capture_logs() as logs:
        for n in range(3):
            writer.record(entry("t", n))
        assert logs == []  # at the bound, nothing dropped yet
        writer.record(entry("t", 3))  # the first drop is reported at once
        for n in range(4, 10):
            writer.record(entry("t", n))  # six more within the interval: held back
        clock.now += 59.0
        writer.record(entry("t", 10))
        clock.now += 1.0
        writer.record(entry("t", 11))  # the interval is over: one line for all since
    drops = [line for line in logs if "dropped" in line["event"]]
    assert [(line["log_level"], line["dropped"], line["dropped_total"]) for line in drops] == [
        ("warning", 1, 1),
        ("warning", 8, 9),
    ]
    assert drops[0]["max_buffered"] == 3
    assert writer.dropped == 9
    assert writer.pending == 3


async def test_drops_not_yet_logged_are_logged_at_close(fresh_engine: AsyncEngine):
    clock = FakeClock()
    writer = UsageWriter(
        fresh_engine, max_batch=1, max_buffered=1, flush_interval=3600, clock=clock
    )
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    with structlog.testing.capture_logs() as logs:
        writer.record(entry("t", 0))
        writer.record(entry("t", 1))  # reported at once
        writer.record(entry("t", 2))
        writer.record(entry("t", 3))  # both held back by the interval
        await writer.close()
    drops = [line["dropped"] for line in logs if "dropped" in line["event"]]
    assert drops == [1, 2]


async def test_the_metrics_follow_the_buffer_the_writes_and_the_drops(fresh_engine: AsyncEngine):
    registry = CollectorRegistry(auto_describe=True)
    writer = UsageWriter(fresh_engine, max_batch=2, max_buffered=3, flush_interval=3600)
    registry.register(UsageMetrics(writer, None))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    tag = uuid.uuid4().hex
    await rename_usage_table(fresh_engine, "usage_records", "usage_records_away")
    for n in range(5):
        writer.record(entry(tag, n))
    assert sample("arona_usage_buffered") == 3
    assert sample("arona_usage_dropped_total", reason="buffer_full") == 2
    assert sample("arona_usage_written_total") == 0
    # Without a write-ahead stream its metrics are absent, its drop reasons zero.
    assert sample("arona_usage_dropped_total", reason="wal_trimmed") == 0
    assert sample("arona_usage_wal_appended_total") is None

    await rename_usage_table(fresh_engine, "usage_records_away", "usage_records")
    await writer.close()
    assert sample("arona_usage_buffered") == 0
    assert sample("arona_usage_written_total") == 3
    assert await count_of(fresh_engine, tag) == 3


async def test_the_app_serves_the_usage_metrics(
    sqlite_settings: Settings, make_app: AppFactory
) -> None:
    settings = with_settings(sqlite_settings, usage_flush_seconds=3600.0)
    app = make_app(settings)
    async with live_server(app) as url, httpx.AsyncClient(base_url=url) as client:
        recorder = app.state.resources.usage_writer
        for n in range(4):
            await recorder.record(entry(uuid.uuid4().hex, n))
        text = (await client.get("/metrics")).text
        assert "arona_usage_buffered 4.0" in text
        assert 'arona_usage_dropped_total{reason="buffer_full"} 0.0' in text
        assert await recorder.flush() == 4
        text = (await client.get("/metrics")).text
        assert "arona_usage_buffered 0.0" in text
        assert "arona_usage_written_total 4.0" in text
