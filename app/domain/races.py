"""Writes that can lose a race to a concurrent request or replica.

A service checks first (the name is free, the row does not exist yet) and then writes;
another writer can get in between. The database's unique and foreign keys are the
arbiter: the loser's write fails with one of ``RACED``, and the service either says
why (``commit_raced``) or reads again and writes over the winner (``retry_raced``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from advanced_alchemy.exceptions import DuplicateKeyError, IntegrityError
from sqlalchemy.exc import IntegrityError as SQLAlchemyIntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session

T = TypeVar("T")

RACED = (DuplicateKeyError, IntegrityError, SQLAlchemyIntegrityError)
"""What a write that lost to a concurrent one raises (advanced-alchemy's wrappers or
SQLAlchemy's own, depending on who issued the statement)."""

Session = AsyncSession | async_scoped_session[AsyncSession]


async def commit_raced(session: Session, *added: object) -> Exception | None:
    """Add ``added`` and commit; the error when a key refused it (a concurrent write got
    there first), rolled back, for the caller to raise what it means (``from`` it).
    Any other failure is rolled back and raised."""
    try:
        session.add_all(added)
        await session.commit()
    except RACED as exc:
        await session.rollback()
        return exc
    except BaseException:
        await session.rollback()
        raise
    return None


async def retry_raced(session: Session, write: Callable[[], Awaitable[T]]) -> T:
    """``write`` (a read, then an insert or an update), once more if another writer
    created the same row between its read and its insert: the second read finds it."""
    try:
        return await write()
    except RACED:
        await session.rollback()
        return await write()
