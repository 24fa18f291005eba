"""Helpers for the auth API tests: fresh databases, direct row edits, a counting hasher.

Rows are edited through a separate engine in the test's own event loop: the app
under ``AsyncTestClient`` runs in another thread's loop, and its pooled connections
belong to that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import argon2
import httpx
import jwt
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.sql import Executable

from app.db.migrate import upgrade
from app.db.models import RefreshToken, User
from app.lib.hashing import sha256_hex
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from tests.support.helpers import PASSWORD
from tests.support.settings import REDIS_URL, base_settings, create_database, drop_database, pg_url


class CountingHasher(PasswordHasher):
    """A real argon2 hasher that records the parameters of every hash it verifies.

    ``_verify_sync`` is what both ``verify`` and ``verify_dummy`` run on the worker
    pool, so the record shows whether a login really spent an argon2 verification
    and with what cost.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self.verified: list[argon2.Parameters] = []

    def _verify_sync(self, hash: str, password: str) -> bool:
        with self._lock:
            self.verified.append(argon2.extract_parameters(hash))
        return super()._verify_sync(hash, password)


def cheap_hasher(cls: type[PasswordHasher] = PasswordHasher, **overrides: int) -> Any:
    params: dict[str, int] = {"time_cost": 1, "memory_cost": 8 * 1024, "parallelism": 1}
    params.update(overrides)
    return cls(**params)


async def execute(settings: Settings, statement: Executable) -> Any:
    """Run one statement against the app's database and return its rows (if any)."""
    engine = create_async_engine(settings.database_url)
    try:
        async with engine.begin() as connection:
            result = await connection.execute(statement)
            return result.all() if result.returns_rows else result.rowcount
    finally:
        await engine.dispose()


async def set_disabled(settings: Settings, email: str, disabled: bool) -> None:
    changed = await execute(
        settings, update(User).where(User.email == email.lower()).values(disabled=disabled)
    )
    assert changed == 1


async def stored_password_hash(settings: Settings, email: str) -> str:
    rows = await execute(settings, select(User.password_hash).where(User.email == email.lower()))
    assert len(rows) == 1
    return str(rows[0][0])


async def expire_refresh_token(settings: Settings, token: str) -> None:
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    changed = await execute(
        settings,
        update(RefreshToken)
        .where(RefreshToken.token_hash == sha256_hex(token))
        .values(expires_at=past),
    )
    assert changed == 1


def claims_of(token: str) -> dict[str, Any]:
    """The claims of a JWT, read without verification (the server verifies)."""
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


@contextlib.asynccontextmanager
async def fresh_database(kind: str, tmp_path: Path) -> AsyncIterator[Settings]:
    """Settings for a brand-new, migrated database with no users at all."""
    if kind == "sqlite":
        settings = base_settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
        await asyncio.to_thread(upgrade, settings)
        yield settings
        return
    name = f"arona_auth_{uuid.uuid4().hex[:10]}"
    await create_database(name)
    try:
        settings = base_settings(
            database_url=pg_url(name),
            redis_url=REDIS_URL,
            redis_prefix=f"test:{uuid.uuid4().hex}:",
            db_pool_size=5,
        )
        await asyncio.to_thread(upgrade, settings)
        yield settings
    finally:
        await drop_database(name)


async def http_register(
    client: httpx.AsyncClient, email: str, password: str = PASSWORD
) -> httpx.Response:
    return await client.post("/api/auth/register", json={"email": email, "password": password})


async def http_login(
    client: httpx.AsyncClient, email: str, password: str = PASSWORD
) -> httpx.Response:
    return await client.post("/api/auth/login", json={"email": email, "password": password})
