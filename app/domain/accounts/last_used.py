"""Batched ``last_used_at`` for API keys: one UPDATE per flush, not one per request."""

from __future__ import annotations

import datetime
from uuid import UUID

from sqlalchemy import Table, bindparam, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import ApiKey
from app.lib.clock import utcnow


class LastUsedRecorder:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._pending: dict[UUID, datetime.datetime] = {}

    def touch(self, key_id: UUID) -> None:
        self._pending[key_id] = utcnow()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> int:
        if not self._pending:
            return 0
        batch, self._pending = self._pending, {}
        table = ApiKey.__table__
        assert isinstance(table, Table)
        statement = (
            update(table)
            .where(table.c.id == bindparam("key_id"))
            .values(last_used_at=bindparam("used_at"))
        )
        rows = [{"key_id": k, "used_at": v} for k, v in batch.items()]
        try:
            async with self._engine.begin() as connection:
                await connection.execute(statement, rows)
        except BaseException:
            # Keep the newest timestamps for the next attempt rather than lose them
            # (cancellation included: shutdown cancels a periodic flush mid-write, then
            # flushes once more).
            for key_id, used_at in batch.items():
                current = self._pending.get(key_id)
                if current is None or current < used_at:
                    self._pending[key_id] = used_at
            raise
        return len(rows)
