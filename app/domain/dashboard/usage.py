"""Platform-wide usage: the usage records of every project, summed by project, model,
backend and UTC day. The sums and the totals query are the usage area's
(``app.domain.usage.services``: ``usage_sums``, ``sum_usage``), the ones behind a
project's usage summary, so the dashboard and the API count alike (cost included)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Project, UsageRecord
from app.domain.prices import amounts
from app.domain.usage.schemas import UsageGroupOut
from app.domain.usage.services import (
    UsageFilters,
    aggregate,
    sum_usage,
    usage_sums,
    utc_day,
)

PERIODS: dict[str, tuple[str, datetime.timedelta]] = {
    "24h": ("Last 24 hours", datetime.timedelta(hours=24)),
    "7d": ("Last 7 days", datetime.timedelta(days=7)),
    "30d": ("Last 30 days", datetime.timedelta(days=30)),
}
DEFAULT_PERIOD = "7d"
TOP = 15


@dataclass(frozen=True, slots=True)
class Totals:
    """An ``UsageGroupOut`` with the label the page shows for its key."""

    key: str
    label: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    errors: int = 0
    cost: float = 0.0
    cost_micros: int = 0
    currency: str | None = None
    cost_estimated: bool = False

    @property
    def cost_text(self) -> str:
        """The exact cost (up to 6 decimals, no trailing zeros) and its currency."""
        return amounts.label(self.cost_micros, self.currency, estimated=self.cost_estimated)

    @classmethod
    def of(cls, label: str, sums: UsageGroupOut) -> Totals:
        return cls(
            key=sums.key or "",
            label=label,
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


@dataclass(slots=True)
class PlatformUsage:
    since: datetime.datetime
    totals: Totals
    by_project: list[Totals] = field(default_factory=list)
    by_model: list[Totals] = field(default_factory=list)
    by_backend: list[Totals] = field(default_factory=list)
    by_day: list[Totals] = field(default_factory=list)


def _within(since: datetime.datetime) -> list[ColumnElement[bool]]:
    return UsageFilters(since=since).conditions()


def _totals(key: str, label: str, row: Any) -> Totals:
    return Totals.of(label, aggregate(key, row))


def period_start(period: str, now: datetime.datetime) -> datetime.datetime:
    return now - PERIODS.get(period, PERIODS[DEFAULT_PERIOD])[1]


async def _grouped(
    session: AsyncSession, key: ColumnElement[Any], since: datetime.datetime, none_label: str
) -> list[Totals]:
    statement = (
        select(key.label("key"), *usage_sums())
        .where(*_within(since))
        .group_by(key)
        .order_by(func.count().desc(), key)
        .limit(TOP)
    )
    out = []
    for row in await session.execute(statement):
        key_text = "" if row.key is None else str(row.key)
        out.append(_totals(key_text, key_text or none_label, row))
    return out


async def _by_project(session: AsyncSession, since: datetime.datetime) -> list[Totals]:
    statement = (
        select(UsageRecord.project_id, Project.name, *usage_sums())
        .outerjoin(Project, Project.id == UsageRecord.project_id)
        .where(*_within(since))
        .group_by(UsageRecord.project_id, Project.name)
        .order_by(func.count().desc(), Project.name)
        .limit(TOP)
    )
    out = []
    for row in await session.execute(statement):
        label = row.name or ("(deleted project)" if row.project_id else "(no project)")
        out.append(_totals(str(row.project_id or ""), label, row))
    return out


def _days(since: datetime.datetime, now: datetime.datetime) -> list[str]:
    day, last, out = since.date(), now.date(), []
    while day <= last:
        out.append(day.isoformat())
        day += datetime.timedelta(days=1)
    return out


async def platform_usage(
    session: AsyncSession, since: datetime.datetime, now: datetime.datetime
) -> PlatformUsage:
    day = utc_day(UsageRecord.created_at)
    daily = {
        str(row.key): row
        for row in await session.execute(
            select(day.label("key"), *usage_sums()).where(*_within(since)).group_by(day)
        )
    }
    by_day = [
        _totals(key, key[5:], daily[key]) if key in daily else Totals(key, key[5:])
        for key in _days(since, now)
    ]
    return PlatformUsage(
        since=since,
        totals=await usage_totals(session, since),
        by_project=await _by_project(session, since),
        by_model=await _grouped(session, UsageRecord.model_requested.expression, since, "?"),
        by_backend=await _grouped(
            session, UsageRecord.backend.expression, since, "(none: custom LLM or not routed)"
        ),
        by_day=by_day,
    )


async def project_totals(
    session: AsyncSession, project_ids: Iterable[UUID], since: datetime.datetime
) -> dict[UUID, Totals]:
    """Each listed project's usage since ``since`` (projects without any are absent)."""
    ids = list(project_ids)
    if not ids:
        return {}
    statement = (
        select(UsageRecord.project_id, *usage_sums())
        .where(UsageRecord.project_id.in_(ids), *_within(since))
        .group_by(UsageRecord.project_id)
    )
    return {
        row.project_id: _totals(str(row.project_id), "", row)
        for row in await session.execute(statement)
    }


async def usage_totals(session: AsyncSession, since: datetime.datetime) -> Totals:
    """Every project's usage since ``since``: the usage API's totals query, unscoped."""
    return Totals.of("All projects", await sum_usage(session, _within(since)))
