"""Fixtures for the database fault tests: a PostgreSQL server of the module's own
(migrated), which a test may stop and start; it is always running again when the test
ends. Import them into a test module (``from tests.faults.pg_fixtures import pg,
pg_running``); kept out of a conftest so other fault tests do not share its start-up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from app.db.migrate import upgrade
from app.lib.ports import free_port
from tests.support.pg_instance import PostgresInstance
from tests.support.settings import base_settings

DATABASE = "arona"


@pytest.fixture(scope="module")
async def pg() -> AsyncIterator[PostgresInstance]:
    """A dedicated, migrated server: database ``arona`` (``pg.sqlalchemy_url(DATABASE)``)."""
    instance = await asyncio.to_thread(PostgresInstance, free_port())
    try:
        await asyncio.to_thread(instance.start)
        conn = await asyncpg.connect(instance.admin_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()
        await asyncio.to_thread(
            upgrade, base_settings(database_url=instance.sqlalchemy_url(DATABASE))
        )
        yield instance
    finally:
        await asyncio.to_thread(instance.close)


@pytest.fixture
def pg_running(pg: PostgresInstance) -> Iterator[PostgresInstance]:
    """``pg``, started again after the test if the test left it stopped."""
    yield pg
    if not pg.running():
        pg.start()
