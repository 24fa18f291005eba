"""Spend per project over the whole platform (platform admins): the usage area's one
set of sums (``usage_sums``) grouped by project, busiest spender first."""

from __future__ import annotations

from uuid import UUID

from sqlalchemy import distinct, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Project, UsageRecord
from app.domain.usage.schemas import ProjectSpendOut
from app.domain.usage.services import UsageFilters, aggregate, usage_sums


async def project_spend(
    session: AsyncSession, filters: UsageFilters, limit: int, offset: int
) -> tuple[list[ProjectSpendOut], int]:
    """One page of projects with matching usage (highest cost, then most requests
    first; calls no project paid for, and deleted projects, as ``projectId`` null /
    their old id without a name), and how many there are."""
    where = filters.conditions()
    total = await session.scalar(select(func.count(distinct(UsageRecord.project_id))).where(*where))
    # count(DISTINCT) skips NULL: the group of calls without a project counts too.
    unattributed = await session.scalar(
        select(func.count())
        .select_from(UsageRecord)
        .where(*where, UsageRecord.project_id.is_(None))
    )
    statement = (
        select(UsageRecord.project_id, Project.name, *usage_sums())
        .outerjoin(Project, Project.id == UsageRecord.project_id)
        .where(*where)
        .group_by(UsageRecord.project_id, Project.name)
        .order_by(
            func.coalesce(func.sum(UsageRecord.cost_micros), 0).desc(),
            func.count().desc(),
            UsageRecord.project_id.asc().nulls_last(),
        )
        .limit(limit)
        .offset(offset)
    )
    items = []
    for row in await session.execute(statement):
        sums = aggregate(None, row)
        project_id: UUID | None = row.project_id
        items.append(
            ProjectSpendOut(
                project_id=project_id,
                project_name=row.name,
                requests=sums.requests,
                prompt_tokens=sums.prompt_tokens,
                completion_tokens=sums.completion_tokens,
                total_tokens=sums.total_tokens,
                errors=sums.errors,
                cost=sums.cost,
                cost_micros=sums.cost_micros,
                currency=sums.currency,
                cost_estimated=sums.cost_estimated,
            )
        )
    return items, int(total or 0) + (1 if unattributed else 0)
