"""0009 (price book, exact usage cost) downgrades and upgrades again on both databases,
keeping usage rows and turning a priced row's float cost into exact micro-units."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.migrate import alembic_commands, current_revision, upgrade
from tests.db.test_migrations import _autogenerate_diff
from tests.support.settings import base_settings, create_database, drop_database, pg_url

_USAGE_ROW = (
    "INSERT INTO usage_records (id, model_requested, endpoint, streamed, prompt_tokens,"
    " completion_tokens, total_tokens, estimated, status, latency_ms, is_custom,"
    " is_override_key, cost, created_at) VALUES (:id, 'video-1', 'video', false, 0, 0, 0,"
    " false, 200, 0, false, false, :cost, '2026-12-01 00:00:00')"
)


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _usage_columns(connection: Connection) -> set[str]:
    return {column["name"] for column in inspect(connection).get_columns("usage_records")}


async def _round_trip_0009(url: str, compare_type: bool) -> None:
    settings = base_settings(database_url=url)
    await asyncio.to_thread(upgrade, settings, "0008")
    engine = create_async_engine(url)
    made = (uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    ids = [u.hex for u in made] if url.startswith("sqlite") else list(made)
    try:
        async with engine.begin() as connection:
            await connection.execute(text(_USAGE_ROW), {"id": ids[0], "cost": 1.234567})
            await connection.execute(text(_USAGE_ROW), {"id": ids[1], "cost": None})
        await asyncio.to_thread(upgrade, settings, "0009")
        assert await current_revision(engine) == "0009"
        async with engine.connect() as connection:
            assert "model_prices" in await connection.run_sync(_tables)
            rows = await connection.execute(
                text(
                    "SELECT cost_micros, currency, cost_estimated FROM usage_records"
                    " ORDER BY cost_micros IS NULL"
                )
            )
            assert [tuple(row) for row in rows] == [(1_234_567, None, False), (None, None, False)]

        await asyncio.to_thread(alembic_commands(settings).downgrade, "0008")
        assert await current_revision(engine) == "0008"
        async with engine.connect() as connection:
            assert "model_prices" not in await connection.run_sync(_tables)
            columns = await connection.run_sync(_usage_columns)
            assert {"cost_micros", "currency", "cost_estimated"}.isdisjoint(columns)
            count = await connection.scalar(text("SELECT count(*) FROM usage_records"))
            assert count == 2

        await asyncio.to_thread(upgrade, settings)
        async with engine.connect() as connection:
            micros = await connection.scalar(
                text("SELECT cost_micros FROM usage_records WHERE cost IS NOT NULL")
            )
            assert micros == 1_234_567
        # A replica still running the code before 0009 inserts rows without the new
        # columns: they are taken, unpriced and not estimated.
        async with engine.begin() as connection:
            await connection.execute(text(_USAGE_ROW), {"id": ids[2], "cost": None})
        async with engine.connect() as connection:
            old_shape = await connection.execute(
                text(
                    "SELECT cost_micros, currency, cost_estimated FROM usage_records WHERE id = :id"
                ),
                {"id": ids[2]},
            )
            assert [tuple(row) for row in old_shape] == [(None, None, False)]
    finally:
        await engine.dispose()
    assert await _autogenerate_diff(url, compare_type) == []


async def test_postgres_price_book_migration_downgrades_and_upgrades_again() -> None:
    name = f"arona_mig_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    try:
        await _round_trip_0009(pg_url(name), compare_type=True)
    finally:
        await drop_database(name)


async def test_sqlite_price_book_migration_downgrades_and_upgrades_again(tmp_path: Path) -> None:
    await _round_trip_0009(f"sqlite+aiosqlite:///{tmp_path / 'trip.db'}", compare_type=False)
