"""Helpers shared by the usage writer and write-ahead stream tests."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import UsageRecord
from app.domain.usage.entry import UsageEntry

FIELDS = [c.name for c in UsageRecord.__table__.columns if c.name != "sa_orm_sentinel"]


def entry(tag: str, n: int = 0, **fields: Any) -> UsageEntry:
    """An entry marked with ``tag`` (in conversation_id) so a test finds only its rows."""
    values: dict[str, Any] = {
        "model_requested": f"model-{n}",
        "endpoint": "chat",
        "status": 200,
        "conversation_id": tag,
        "prompt_tokens": n,
        "completion_tokens": 2 * n,
        "total_tokens": 3 * n,
    }
    values.update(fields)
    return UsageEntry(**values)


async def rows_of(engine: AsyncEngine, tag: str) -> list[dict[str, Any]]:
    async with engine.connect() as connection:
        result = await connection.execute(
            select(UsageRecord.__table__).where(UsageRecord.conversation_id == tag)
        )
        return [dict(row._mapping) for row in result]


async def count_of(engine: AsyncEngine, tag: str) -> int:
    async with engine.connect() as connection:
        return int(
            await connection.scalar(
                select(func.count())
                .select_from(UsageRecord)
                .where(UsageRecord.conversation_id == tag)
            )
            or 0
        )


async def rename_usage_table(engine: AsyncEngine, old: str, new: str) -> None:
    """A real failure: the INSERT fails in the database, not in a mock."""
    async with engine.begin() as connection:
        await connection.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
