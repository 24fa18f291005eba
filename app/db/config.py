"""Database wiring: the advanced-alchemy config built from settings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from uuid import uuid4

from advanced_alchemy.extensions.litestar import (
    AlembicAsyncConfig,
    AsyncSessionConfig,
    EngineConfig,
    SQLAlchemyAsyncConfig,
)
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.outage import install_connect_errors
from app.lib.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent.parent / "migrations"
VERSION_TABLE = "alembic_version"


def _engine_config(settings: Settings) -> EngineConfig:
    if settings.is_sqlite:
        # One file, many coroutines: a generous busy timeout turns lock contention
        # into a short wait instead of "database is locked".
        return EngineConfig(connect_args={"timeout": 30})
    return EngineConfig(
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        # Bounded waits: with the database down or black-holed a request fails with a
        # 503 within these, instead of asyncpg's 60 s connect or the pool's 30 s wait.
        # (SQLAlchemy takes whole seconds for the pool; at least one.)
        pool_timeout=max(1, math.ceil(settings.db_pool_timeout_seconds)),
        connect_args=_connect_timeout(settings),
    )


def _connect_timeout(settings: Settings) -> dict[str, Any]:
    """The connect timeout in the driver's own argument."""
    if "+asyncpg" in settings.database_url.split("://", 1)[0]:
        return {"timeout": settings.db_connect_timeout_seconds}
    if "+psycopg" in settings.database_url.split("://", 1)[0]:
        return {"connect_timeout": max(1, math.ceil(settings.db_connect_timeout_seconds))}
    return {}


def build_db_config(settings: Settings) -> SQLAlchemyAsyncConfig:
    # advanced-alchemy keeps every config's state keys in class-level sets and finds a
    # free one by trying ``key_1``, ``key_2``, ... recursively: a process that builds
    # many configs (a test run builds one per app) hits the recursion limit near a
    # thousand. Keys unique from the start are accepted on the first check.
    suffix = uuid4().hex
    config = SQLAlchemyAsyncConfig(
        session_scope_key=f"_sqlalchemy_db_session_{suffix}",
        engine_app_state_key=f"db_engine_{suffix}",
        session_maker_app_state_key=f"session_maker_class_{suffix}",
        connection_string=settings.database_url,
        engine_config=_engine_config(settings),
        session_config=AsyncSessionConfig(expire_on_commit=False),
        before_send_handler="autocommit",
        create_all=False,
        alembic_config=AlembicAsyncConfig(
            script_location=str(MIGRATIONS_DIR),
            version_table_name=VERSION_TABLE,
            script_config=str(MIGRATIONS_DIR / "alembic.ini"),
            render_as_batch=True,
            compare_type=True,
        ),
    )
    # A refused or timed-out connect surfaces as a SQLAlchemy OperationalError (a 503
    # ``database_unavailable``), not a bare OSError (app.db.outage).
    install_connect_errors(config.get_engine())
    return config


def install_sqlite_pragmas(engine: AsyncEngine) -> None:
    """SQLite ignores foreign keys unless asked, and WAL lets readers run beside a writer."""
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()
