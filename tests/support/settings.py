"""What the fixtures are built from, and what test modules use beside them: the
services' addresses, settings for a test app, throwaway PostgreSQL databases."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import asyncpg
from litestar import Litestar

from app.lib.settings import Settings, load_settings
from app.lib.vault import generate_key_spec

PG_ADMIN_DSN = os.environ.get("ARONA_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("ARONA_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
JWT_SECRET = "test-secret-" + "x" * 40


def pg_url(dbname: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return f"{base}/{dbname}"


async def create_database(name: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def base_settings(**overrides: object) -> Settings:
    return load_settings(
        {},
        jwt_secret=JWT_SECRET,
        vault_keys=load_settings({"ARONA_VAULT_KEYS": generate_key_spec("k1")}).vault_keys,
        **{
            "registration_open": True,
            "log_level": "WARNING",
            # Above the 5 s default: on the shared CI machine a connection has taken
            # longer, and an app whose start-up gives up fails a whole module.
            "db_connect_timeout_seconds": 15.0,
            **overrides,
        },
    )


AppFactory = Callable[[Settings], Litestar]


def with_settings(settings: Settings, **changes: object) -> Settings:
    return replace(settings, **changes)  # type: ignore[arg-type]
