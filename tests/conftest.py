"""Shared fixtures: a throwaway PostgreSQL database (migrated, not create_all), real
Redis, and apps built by ``create_app`` driven over ASGI.

Services are never skipped: if PostgreSQL or Redis is missing the tests fail.
``.ci/run`` starts both before calling ``make test``. Helpers test modules import
live in ``tests/support/``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.db.migrate import upgrade
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.server.app import create_app
from tests.support.settings import (
    REDIS_URL,
    AppFactory,
    base_settings,
    create_database,
    drop_database,
    pg_url,
)
from tests.support.status_contract import StatusContract


@pytest.fixture(scope="session")
def fast_hasher() -> Iterator[PasswordHasher]:
    # Cheap argon2 parameters: the suite hashes hundreds of passwords.
    hasher = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1)
    yield hasher
    hasher.close()


@pytest.fixture(scope="session")
async def pg_database() -> AsyncIterator[str]:
    name = f"arona_test_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    url = pg_url(name)
    await asyncio.to_thread(upgrade, base_settings(database_url=url))
    yield url
    await drop_database(name)


@pytest.fixture(scope="session")
async def sqlite_database(tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("sqlite") / "arona.db"
    url = f"sqlite+aiosqlite:///{path}"
    await asyncio.to_thread(upgrade, base_settings(database_url=url))
    return url


@pytest.fixture
def pg_settings(pg_database: str) -> Settings:
    return base_settings(
        database_url=pg_database,
        redis_url=REDIS_URL,
        redis_prefix=f"test:{uuid.uuid4().hex}:",
        db_pool_size=5,
    )


@pytest.fixture
def sqlite_settings(sqlite_database: str) -> Settings:
    return base_settings(database_url=sqlite_database)


@pytest.fixture(scope="session")
def status_contract() -> Iterator[StatusContract]:
    """Checks, once the session is over, that every error status the apps answered is
    in their OpenAPI document (``tests/support/status_contract.py``)."""
    contract = StatusContract()
    yield contract
    report = contract.report()
    assert not report, (
        "statuses answered by these operations are missing from the OpenAPI document "
        "(document them in app/server/openapi.py):\n" + report
    )


@pytest.fixture
def make_app(fast_hasher: PasswordHasher, status_contract: StatusContract) -> Iterator[AppFactory]:
    made: list[Litestar] = []

    def factory(settings: Settings) -> Litestar:
        app = create_app(settings, password_hasher=fast_hasher)
        made.append(app)
        return app

    yield factory
    for app in made:
        status_contract.record(app)


@pytest.fixture
async def client(
    pg_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """The production shape: PostgreSQL + Redis."""
    async with AsyncTestClient(app=make_app(pg_settings)) as test_client:
        yield test_client


@pytest.fixture(params=["postgres", "sqlite"])
async def any_client(
    request: pytest.FixtureRequest,
    make_app: AppFactory,
    pg_settings: Settings,
    sqlite_settings: Settings,
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """Runs a test on both the production shape and the embedded SQLite default."""
    settings = pg_settings if request.param == "postgres" else sqlite_settings
    async with AsyncTestClient(app=make_app(settings)) as test_client:
        yield test_client
