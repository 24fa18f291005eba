"""Every database access of the video jobs: rows in, rows out, no business rules.

Writes that race each other (a cancel, the poller's step, another replica's claim)
are single conditional statements, ``UPDATE ... WHERE status IN (...) [AND
lease_owner = me] RETURNING``: whichever commits first wins and the other changes
nothing. They run the same on PostgreSQL and SQLite (3.35+ for RETURNING).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.models import UsageRecord, VideoJob, VideoPrice

ACTIVE = ("queued", "running")
"""The statuses the poller drives; every other one is final."""


@dataclass(frozen=True, slots=True)
class OwnerScope:
    """Whose jobs a query may see: the project's, or a user's own (no project)."""

    project_id: UUID | None
    user_id: UUID | None

    def clause(self) -> ColumnElement[bool]:
        if self.project_id is not None:
            return VideoJob.project_id == self.project_id
        if self.user_id is not None:
            return and_(VideoJob.project_id.is_(None), VideoJob.user_id == self.user_id)
        return VideoJob.id.is_(None)  # nobody: matches no row


class JobStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    def session(self) -> AsyncSession:
        return self._sessions()

    async def insert(self, row: VideoJob) -> VideoJob:
        async with self._sessions() as session:
            session.add(row)
            await session.commit()
        return row

    async def get(self, job_id: UUID, scope: OwnerScope | None = None) -> VideoJob | None:
        query = select(VideoJob).where(VideoJob.id == job_id)
        if scope is not None:
            query = query.where(scope.clause())
        async with self._sessions() as session:
            return (await session.execute(query)).scalar_one_or_none()

    async def by_stream(self, stream_id: str, scope: OwnerScope) -> VideoJob | None:
        query = select(VideoJob).where(VideoJob.stream_id == stream_id, scope.clause())
        async with self._sessions() as session:
            return (await session.execute(query)).scalar_one_or_none()

    async def page(
        self, scope: OwnerScope | None, limit: int, offset: int
    ) -> tuple[list[VideoJob], int]:
        """Newest first (the id breaks ties between equal times); ``scope=None``: all."""
        query = select(VideoJob)
        count = select(func.count()).select_from(VideoJob)
        if scope is not None:
            query, count = query.where(scope.clause()), count.where(scope.clause())
        query = (
            query.order_by(VideoJob.created_at.desc(), VideoJob.id.desc())
            .limit(limit)
            .offset(offset)
        )
        async with self._sessions() as session:
            rows = list((await session.execute(query)).scalars())
            total = int((await session.execute(count)).scalar_one())
        return rows, total

    async def update_if(
        self,
        job_id: UUID,
        values: Mapping[str, Any],
        *,
        statuses: Collection[str] = ACTIVE,
        lease_owner: str | None = None,
        scope: OwnerScope | None = None,
        usage: Callable[[VideoJob], Mapping[str, Any]] | None = None,
    ) -> VideoJob | None:
        """Change the job if it is still in ``statuses`` (and held by ``lease_owner``,
        and visible to ``scope``, when given); the changed row, or None if nothing
        matched. ``usage`` builds a ``usage_records`` row from the changed job; it is
        written in the same transaction, so a job is metered exactly once."""
        conditions: list[ColumnElement[bool]] = [
            VideoJob.id == job_id,
            VideoJob.status.in_(tuple(statuses)),
        ]
        if lease_owner is not None:
            conditions.append(VideoJob.lease_owner == lease_owner)
        if scope is not None:
            conditions.append(scope.clause())
        statement = (
            update(VideoJob)
            .where(*conditions)
            .values(**values)
            .returning(VideoJob)
            .execution_options(synchronize_session=False)
        )
        async with self._sessions() as session:
            row = (await session.execute(statement)).scalar_one_or_none()
            if row is not None and usage is not None:
                await session.execute(insert(UsageRecord).values(**usage(row)))
            await session.commit()
        return row

    async def claim(
        self,
        owner: str,
        now: datetime.datetime,
        until: datetime.datetime,
        limit: int,
        *,
        busy: Collection[UUID] = (),
    ) -> list[VideoJob]:
        """Take the lease of up to ``limit`` due jobs nobody else holds (free, held by
        ``owner`` already, or whose holder let the lease run out), in one statement.
        ``busy``: jobs ``owner`` is taking a step of now (held, and not to start twice).

        The conditions are repeated outside the subquery: on PostgreSQL a concurrent
        claim that locked the same row first makes this one re-check them on the
        committed row (and skip it); ``SKIP LOCKED`` spares the wait. SQLite runs one
        writer at a time and ignores ``FOR UPDATE``.
        """
        free = or_(
            VideoJob.lease_owner.is_(None),
            VideoJob.lease_owner == owner,
            VideoJob.lease_expires_at < now,
        )
        due = and_(VideoJob.status.in_(ACTIVE), VideoJob.next_poll_at <= now, free)
        if busy:
            due = and_(due, VideoJob.id.not_in(list(busy)))
        candidates = (
            select(VideoJob.id)
            .where(due)
            .order_by(VideoJob.next_poll_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        statement = (
            update(VideoJob)
            .where(VideoJob.id.in_(candidates.scalar_subquery()), due)
            .values(lease_owner=owner, lease_expires_at=until)
            .returning(VideoJob)
            .execution_options(synchronize_session=False)
        )
        async with self._sessions() as session:
            rows = list((await session.execute(statement)).scalars())
            await session.commit()
        return rows

    async def renew(self, job_ids: Sequence[UUID], owner: str, until: datetime.datetime) -> int:
        """Extend the leases ``owner`` still holds; returns how many it still holds."""
        if not job_ids:
            return 0
        statement = (
            update(VideoJob)
            .where(
                VideoJob.id.in_(list(job_ids)),
                VideoJob.lease_owner == owner,
                VideoJob.status.in_(ACTIVE),
            )
            .values(lease_expires_at=until)
            .execution_options(synchronize_session=False)
        )
        async with self._sessions() as session:
            result = await session.execute(statement)
            await session.commit()
        return int(getattr(result, "rowcount", 0) or 0)

    async def release_all(self, owner: str) -> int:
        """Give back every lease ``owner`` holds (a graceful stop): due at once elsewhere."""
        statement = (
            update(VideoJob)
            .where(VideoJob.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        async with self._sessions() as session:
            result = await session.execute(statement)
            await session.commit()
        return int(getattr(result, "rowcount", 0) or 0)

    async def price_for(self, models: Sequence[str]) -> VideoPrice | None:
        """The price of the first of ``models`` that has one."""
        wanted = [m for m in dict.fromkeys(models) if m]
        if not wanted:
            return None
        async with self._sessions() as session:
            rows = {
                row.model: row
                for row in (
                    await session.execute(select(VideoPrice).where(VideoPrice.model.in_(wanted)))
                ).scalars()
            }
        return next((rows[m] for m in wanted if m in rows), None)
