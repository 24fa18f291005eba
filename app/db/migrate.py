"""Apply and check Alembic migrations (advanced-alchemy's Alembic integration).

``upgrade`` runs the migration environment, which drives its own event loop, so
async callers run it in a worker thread (``await asyncio.to_thread(upgrade, s)``).
"""

from __future__ import annotations

from advanced_alchemy.alembic.commands import AlembicCommands
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import app.db.models  # noqa: F401  (registers every table on the metadata)
from app.db.config import MIGRATIONS_DIR, build_db_config
from app.lib.settings import Settings


class DatabaseNotMigratedError(RuntimeError):
    """The database schema is older (or newer) than this build expects."""


def alembic_commands(settings: Settings) -> AlembicCommands:
    return AlembicCommands(sqlalchemy_config=build_db_config(settings))


def upgrade(settings: Settings, revision: str = "head") -> None:
    alembic_commands(settings).upgrade(revision=revision)


def head_revision() -> str:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    head = script.get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(_current_revision)


async def ensure_migrated(engine: AsyncEngine) -> None:
    """Refuse to serve on a schema this build does not match."""
    current = await current_revision(engine)
    head = head_revision()
    if current != head:
        state = "has no schema" if current is None else f"is at revision {current}"
        raise DatabaseNotMigratedError(
            f"The database {state}, but this build needs revision {head}. "
            "Run `arona migrate` (or `make migrate`) first."
        )
