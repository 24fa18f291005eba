"""What each API key or runtime token of a project spent, beside its limits.

A credential's spend is read from ``usage_records`` by ``api_key_id`` (runtime chats
record their token's id there too), for the current UTC calendar month and day at
once: one grouped statement for a whole page of credentials, never one per key. The
period shown is the key's ``budget_period`` (``day`` or ``month``), ``month`` when it
has no budget.

Amounts are summed per currency: prices may be in several currencies, and micro-units
of different currencies must not be added. The leading currency (the largest amount)
is the one a budget is compared with; every currency's amount is listed too.
``requests`` counts every metered call of the credential, refused ones included (as
the usage summary does); ``tokens`` is their ``total_tokens``.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import UsageRecord
from app.domain.prices.amounts import text as amount_text
from app.domain.usage.schemas import SpendFigures, SpendOut

Period = Literal["day", "month"]


@dataclass(frozen=True, slots=True)
class Spend:
    """One credential's usage over one period."""

    micros: Mapping[str, int] = field(default_factory=dict)
    """Priced spend in micro-units, per currency (only currencies with priced calls)."""
    tokens: int = 0
    requests: int = 0

    @property
    def currency(self) -> str | None:
        """The leading currency: the largest amount (ties: alphabetical); ``None``
        when nothing was priced."""
        if not self.micros:
            return None
        return min(self.micros, key=lambda c: (-self.micros[c], c))

    @property
    def amount_micros(self) -> int:
        """The spend in the leading currency (0 when nothing was priced)."""
        currency = self.currency
        return 0 if currency is None else self.micros[currency]


NOTHING = Spend()


@dataclass(frozen=True, slots=True)
class KeySpend:
    """One credential's usage this UTC month and today."""

    month: Spend = NOTHING
    day: Spend = NOTHING

    def of(self, period: Period) -> Spend:
        return self.day if period == "day" else self.month


NO_SPEND = KeySpend()


@dataclass(frozen=True, slots=True)
class Periods:
    """The UTC calendar day and month that contain ``now``."""

    day_start: datetime.datetime
    day_end: datetime.datetime
    month_start: datetime.datetime
    month_end: datetime.datetime

    @classmethod
    def at(cls, now: datetime.datetime) -> Periods:
        now = now.astimezone(datetime.UTC)
        day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        month_start = day_start.replace(day=1)
        # The 28th plus four days is always in the next month.
        month_end = (month_start.replace(day=28) + datetime.timedelta(days=4)).replace(day=1)
        return cls(day_start, day_start + datetime.timedelta(days=1), month_start, month_end)

    def start(self, period: Period) -> datetime.datetime:
        return self.day_start if period == "day" else self.month_start


def period_of(budget_period: str | None) -> Period:
    """The period a credential's spend is shown for: its budget's, else the month."""
    return "day" if budget_period == "day" else "month"


async def key_spend(
    session: AsyncSession,
    project_id: UUID,
    credential_ids: Collection[UUID],
    *,
    now: datetime.datetime,
) -> dict[UUID, KeySpend]:
    """This month's and today's usage of each of ``credential_ids`` (API key or runtime
    token ids) in ``project_id``; an id without usage maps to ``NO_SPEND``. One
    statement (none for no ids), grouped by credential and currency; the day is a
    conditional sum inside the month, which always contains it."""
    result = dict.fromkeys(credential_ids, NO_SPEND)
    if not result:
        return result
    periods = Periods.at(now)
    r = UsageRecord
    today = and_(r.created_at >= periods.day_start, r.created_at < periods.day_end)
    statement = (
        select(
            r.api_key_id,
            r.currency,
            func.count().label("month_requests"),
            func.coalesce(func.sum(r.total_tokens), 0).label("month_tokens"),
            func.coalesce(func.sum(r.cost_micros), 0).label("month_micros"),
            func.coalesce(func.sum(case((today, 1), else_=0)), 0).label("day_requests"),
            func.coalesce(func.sum(case((today, r.total_tokens), else_=0)), 0).label("day_tokens"),
            func.coalesce(func.sum(case((today, r.cost_micros), else_=0)), 0).label("day_micros"),
        )
        # Scoped to the project: a credential id never reads another tenant's rows.
        .where(
            r.project_id == project_id,
            r.api_key_id.in_(list(result)),
            r.created_at >= periods.month_start,
            r.created_at < periods.month_end,
        )
        .group_by(r.api_key_id, r.currency)
    )
    month: dict[UUID, _Sums] = {}
    day: dict[UUID, _Sums] = {}
    for row in await session.execute(statement):
        month.setdefault(row.api_key_id, _Sums()).add(
            row.currency, row.month_micros, row.month_tokens, row.month_requests
        )
        if row.day_requests:
            day.setdefault(row.api_key_id, _Sums()).add(
                row.currency, row.day_micros, row.day_tokens, row.day_requests
            )
    for key_id, sums in month.items():
        result[key_id] = KeySpend(
            month=sums.spend(), day=day[key_id].spend() if key_id in day else NOTHING
        )
    return result


@dataclass(slots=True)
class _Sums:
    """A credential's groups (one per currency, ``None`` for unpriced calls) added up."""

    micros: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    requests: int = 0

    def add(self, currency: str | None, micros: Any, tokens: Any, requests: Any) -> None:
        # A group with a currency holds priced calls only (the meter sets the currency
        # with the cost), so its currency is shown even when it sums to zero.
        if currency is not None:
            self.micros[currency] = self.micros.get(currency, 0) + int(micros)
        self.tokens += int(tokens)
        self.requests += int(requests)

    def spend(self) -> Spend:
        return Spend(dict(self.micros), self.tokens, self.requests)


# ------------------------------------------------------------------ the wire


def used_percent(spent_micros: int, budget_micros: int | None) -> float | None:
    """How much of the budget the spend used, in percent (over 100 when past it);
    a zero budget is used up by any spend at all."""
    if budget_micros is None:
        return None
    if budget_micros == 0:
        return 100.0 if spent_micros > 0 else 0.0
    return round(spent_micros * 100 / budget_micros, 2)


def figures(spend: Spend) -> SpendFigures:
    return SpendFigures(
        amount=amount_text(spend.amount_micros),
        currency=spend.currency,
        by_currency={c: amount_text(m) for c, m in sorted(spend.micros.items())},
        tokens=spend.tokens,
        requests=spend.requests,
    )


def spend_out(
    spend: KeySpend,
    *,
    budget_micros: int | None,
    budget_period: str | None,
    now: datetime.datetime,
) -> SpendOut:
    """The ``spend`` object of a key or token: its budget period's figures (the month
    without a budget), the budget and how much of it is used, and today's figures."""
    period = period_of(budget_period)
    current = spend.of(period)
    shown = figures(current)
    return SpendOut(
        period=period,
        period_start=Periods.at(now).start(period),
        amount=shown.amount,
        currency=shown.currency,
        by_currency=shown.by_currency,
        tokens=shown.tokens,
        requests=shown.requests,
        budget=None if budget_micros is None else amount_text(budget_micros),
        budget_used_percent=used_percent(current.amount_micros, budget_micros),
        today=figures(spend.day),
    )
