"""Migrations are the schema: applying them yields exactly the models, on both databases."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from advanced_alchemy.base import metadata_registry
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from app.db.migrate import (
    DatabaseNotMigratedError,
    alembic_commands,
    current_revision,
    ensure_migrated,
    head_revision,
    upgrade,
)
from app.db.models import (
    ApiKey,
    BackendConfig,
    ModelProfile,
    Project,
    ProjectWebhook,
    User,
    WebhookDelivery,
)
from tests.support.settings import base_settings, create_database, drop_database, pg_url


def _diff(connection: Connection, compare_type: bool) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": compare_type})
    return list(compare_metadata(context, metadata_registry.get(None)))


async def _autogenerate_diff(url: str, compare_type: bool = True) -> list[object]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_diff, compare_type)
    finally:
        await engine.dispose()


async def test_postgres_migrations_match_models_exactly():
    name = f"arona_mig_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    url = pg_url(name)
    try:
        await asyncio.to_thread(upgrade, base_settings(database_url=url))
        assert await _autogenerate_diff(url) == []
    finally:
        await drop_database(name)


async def test_sqlite_migrations_match_models(tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    await asyncio.to_thread(upgrade, base_settings(database_url=url))
    # SQLite reflects column types as storage affinities, so only structure is compared.
    assert await _autogenerate_diff(url, compare_type=False) == []


def _columns(connection: Connection, table: str) -> set[str]:
    return {column["name"] for column in inspect(connection).get_columns(table)}


async def _routing_capacity_columns(engine: AsyncEngine) -> tuple[bool, bool]:
    async with engine.connect() as connection:
        backends = await connection.run_sync(_columns, "backend_configs")
        profiles = await connection.run_sync(_columns, "model_profiles")
    return "max_concurrency" in backends, "routing_score" in profiles


async def _round_trip_0008(url: str, compare_type: bool) -> None:
    """0008 adds two nullable columns; its downgrade drops them and keeps the rows."""
    settings = base_settings(database_url=url)
    await asyncio.to_thread(upgrade, settings, "0007")
    engine = create_async_engine(url)
    try:
        assert await _routing_capacity_columns(engine) == (False, False)
        await asyncio.to_thread(upgrade, settings, "0008")
        assert await current_revision(engine) == "0008"
        assert await _routing_capacity_columns(engine) == (True, True)
        async with async_sessionmaker(engine)() as session:
            session.add(BackendConfig(name="b", kind="vllm", url="http://h:1", max_concurrency=8))
            session.add(ModelProfile(id="p", name="P", base_model="m", routing_score="seed"))
            await session.commit()

        await asyncio.to_thread(alembic_commands(settings).downgrade, "0007")
        assert await current_revision(engine) == "0007"
        assert await _routing_capacity_columns(engine) == (False, False)
        async with engine.connect() as connection:
            assert (await connection.execute(text("SELECT name FROM backend_configs"))).all() == [
                ("b",)
            ]
            assert (await connection.execute(text("SELECT id FROM model_profiles"))).all() == [
                ("p",)
            ]

        await asyncio.to_thread(upgrade, settings)
        async with engine.connect() as connection:
            slots = await connection.execute(text("SELECT max_concurrency FROM backend_configs"))
            assert slots.all() == [(None,)]
            score = await connection.execute(text("SELECT routing_score FROM model_profiles"))
            assert score.all() == [(None,)]
    finally:
        await engine.dispose()
    assert await _autogenerate_diff(url, compare_type) == []


async def test_postgres_routing_capacity_migration_downgrades_and_upgrades_again():
    name = f"arona_mig_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    try:
        await _round_trip_0008(pg_url(name), compare_type=True)
    finally:
        await drop_database(name)


async def test_sqlite_routing_capacity_migration_downgrades_and_upgrades_again(tmp_path: Path):
    await _round_trip_0008(f"sqlite+aiosqlite:///{tmp_path / 'trip.db'}", compare_type=False)


async def test_unmigrated_database_is_refused_with_a_clear_message(tmp_path: Path):
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(DatabaseNotMigratedError) as excinfo:
            await ensure_migrated(engine)
    finally:
        await engine.dispose()
    message = str(excinfo.value)
    assert "has no schema" in message
    assert head_revision() in message
    assert "arona migrate" in message


async def test_app_start_refuses_an_unmigrated_database(tmp_path: Path, make_app):
    from litestar.testing import AsyncTestClient

    settings = base_settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(BaseException) as excinfo:  # noqa: PT011 (lifespan wraps it in a group)
        async with AsyncTestClient(app=make_app(settings)):
            pass
    error = excinfo.value
    if isinstance(error, BaseExceptionGroup):
        assert error.subgroup(DatabaseNotMigratedError) is not None
    else:
        assert isinstance(error, DatabaseNotMigratedError)


_GOVERNANCE = {"allowed_models", "rpm", "tpm", "budget_micros", "budget_period", "labels"}


async def _governance_columns(engine: AsyncEngine) -> tuple[set[str], set[str]]:
    async with engine.connect() as connection:
        keys = await connection.run_sync(_columns, "api_key")
        tokens = await connection.run_sync(_columns, "runtime_token")
    return keys & (_GOVERNANCE | {"expires_at"}), tokens & _GOVERNANCE


async def _round_trip_0010(url: str, compare_type: bool) -> None:
    """0010 adds nullable governance columns to keys and tokens; its downgrade drops
    them and keeps the rows (and a runtime token keeps its own ``expires_at``)."""
    settings = base_settings(database_url=url)
    await asyncio.to_thread(upgrade, settings, "0008")
    engine = create_async_engine(url)
    try:
        assert await _governance_columns(engine) == (set(), set())
        await asyncio.to_thread(upgrade, settings, "0010")
        assert await current_revision(engine) == "0010"
        assert await _governance_columns(engine) == (_GOVERNANCE | {"expires_at"}, _GOVERNANCE)
        async with async_sessionmaker(engine)() as session:
            user = User(email="a@b.c", password_hash="x")
            session.add(user)
            await session.flush()
            project = Project(name="p", slug="p", owner_id=user.id)
            session.add(project)
            await session.flush()
            session.add(
                ApiKey(
                    project_id=project.id,
                    name="k",
                    prefix="ak-1",
                    key_hash="h",
                    rpm=5,
                    budget_micros=2_000_000,
                    budget_period="day",
                    allowed_models=["gpt-*"],
                    labels={"team": "a"},
                )
            )
            await session.commit()

        await asyncio.to_thread(alembic_commands(settings).downgrade, "0008")
        assert await current_revision(engine) == "0008"
        assert await _governance_columns(engine) == (set(), set())
        async with engine.connect() as connection:
            assert (await connection.execute(text("SELECT name FROM api_key"))).all() == [("k",)]
            tokens = await connection.run_sync(_columns, "runtime_token")
            assert "expires_at" in tokens

        await asyncio.to_thread(upgrade, settings, "0010")
        async with engine.connect() as connection:
            row = await connection.execute(
                text("SELECT rpm, budget_micros, expires_at FROM api_key")
            )
            assert row.all() == [(None, None, None)]
    finally:
        await engine.dispose()
    await asyncio.to_thread(upgrade, settings)
    assert await _autogenerate_diff(url, compare_type) == []


async def test_postgres_key_governance_migration_downgrades_and_upgrades_again():
    name = f"arona_mig_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    try:
        await _round_trip_0010(pg_url(name), compare_type=True)
    finally:
        await drop_database(name)


async def test_sqlite_key_governance_migration_downgrades_and_upgrades_again(tmp_path: Path):
    await _round_trip_0010(f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}", compare_type=False)


async def _webhook_tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        names = await connection.run_sync(lambda c: set(inspect(c).get_table_names()))
    return names & {"project_webhooks", "webhook_deliveries"}


async def _round_trip_0012(url: str, compare_type: bool) -> None:
    """0012 adds two tables; its downgrade drops them (and their rows) and leaves the
    projects they hung from."""
    settings = base_settings(database_url=url)
    await asyncio.to_thread(upgrade, settings, "0011")
    engine = create_async_engine(url)
    try:
        assert await _webhook_tables(engine) == set()
        await asyncio.to_thread(upgrade, settings, "0012")
        assert await current_revision(engine) == "0012"
        assert await _webhook_tables(engine) == {"project_webhooks", "webhook_deliveries"}
        async with async_sessionmaker(engine)() as session:
            user = User(email="a@b.c", password_hash="x")
            session.add(user)
            await session.flush()
            project = Project(name="p", slug="p", owner_id=user.id)
            session.add(project)
            await session.flush()
            hook = ProjectWebhook(
                project_id=project.id,
                url="https://hooks.example.com/arona",
                events=["budget.threshold"],
                secret_encrypted="v1:k1:x",
                secret_hint="••••abcd",
            )
            session.add(hook)
            await session.flush()
            session.add(
                WebhookDelivery(
                    webhook_id=hook.id,
                    event="budget.threshold",
                    alert_id="a-1",
                    payload={"type": "budget.threshold"},
                    status="pending",
                )
            )
            await session.commit()
        async with engine.connect() as connection:
            due = await connection.execute(
                text("SELECT status, attempts, attempt_log FROM webhook_deliveries")
            )
            assert [(s, a) for s, a, _ in due.all()] == [("pending", 0)]

        await asyncio.to_thread(alembic_commands(settings).downgrade, "0011")
        assert await current_revision(engine) == "0011"
        assert await _webhook_tables(engine) == set()
        async with engine.connect() as connection:
            assert (await connection.execute(text("SELECT slug FROM project"))).all() == [("p",)]

        await asyncio.to_thread(upgrade, settings, "0012")
        async with engine.connect() as connection:
            rows = await connection.execute(text("SELECT count(*) FROM project_webhooks"))
            assert rows.scalar_one() == 0
    finally:
        await engine.dispose()
    await asyncio.to_thread(upgrade, settings)
    assert await _autogenerate_diff(url, compare_type) == []


async def test_postgres_webhooks_migration_downgrades_and_upgrades_again():
    name = f"arona_mig_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    try:
        await _round_trip_0012(pg_url(name), compare_type=True)
    finally:
        await drop_database(name)


async def test_sqlite_webhooks_migration_downgrades_and_upgrades_again(tmp_path: Path):
    await _round_trip_0012(f"sqlite+aiosqlite:///{tmp_path / 'hooks.db'}", compare_type=False)
