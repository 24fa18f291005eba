"""Alembic environment: runs migrations on Arona's engine, one transaction per run."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, cast

from advanced_alchemy.base import metadata_registry
from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import AsyncEngine, async_engine_from_config

import app.db.models  # noqa: F401  (registers every table on the metadata)

if TYPE_CHECKING:
    from advanced_alchemy.alembic.commands import AlembicCommandConfig
    from sqlalchemy.engine import Connection

config = cast("AlembicCommandConfig", context.config)


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata_registry.get(config.bind_key),
        compare_type=True,
        version_table=config.version_table_name,
        render_as_batch=config.render_as_batch,
        user_module_prefix=config.user_module_prefix,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    _configure(url=config.db_url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_migrations_online() -> None:
    # A fresh NullPool engine: the migration must not share pooled connections
    # with a running app (it may be driven from another thread and loop).
    configuration = config.get_section(config.config_ini_section) or {}
    configuration["sqlalchemy.url"] = config.db_url
    engine: AsyncEngine = async_engine_from_config(
        configuration, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    async with engine.connect() as connection:
        await connection.run_sync(do_run_migrations)
        await connection.commit()
    await engine.dispose()


def run_online_from_any_thread() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(run_migrations_online())
        return
    # Called from code already inside an event loop: use a private loop in a worker.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, run_migrations_online()).result()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_online_from_any_thread()
