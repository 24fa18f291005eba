"""A project's quota as ``GET /quota`` answers it (the console and the dashboard show
the same): both sides of every limit, what applies, and the current windows' use."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from app.db.models import ProjectQuota
from app.domain.accounts.governance import budget_text
from app.domain.quotas.errors import Metric, WindowName
from app.domain.quotas.fields import DEFAULT_CURRENCY, FIELDS, QuotaField, QuotaValues
from app.domain.quotas.gate import QuotaGate, WindowUsage
from app.domain.quotas.limits import QuotaLimits
from app.domain.quotas.schemas import (
    LimitsOut,
    MoneyUsageOut,
    QuotaOut,
    QuotaUsageOut,
    SpendUsageOut,
    TokenUsageOut,
    WindowUsageOut,
)

Counted = dict[tuple[Metric, WindowName], WindowUsage]


def limits_out(value: Callable[[QuotaField], int | None]) -> LimitsOut:
    """One side of the limits, ``value`` giving each field's (money in micro-units)."""
    v = {f.effective: value(f) for f in FIELDS}
    return LimitsOut(
        per_minute=v["per_minute"],
        per_day=v["per_day"],
        per_month=v["per_month"],
        tokens_per_minute=v["tokens_per_minute"],
        tokens_per_day=v["tokens_per_day"],
        tokens_per_month=v["tokens_per_month"],
        budget_per_day=budget_text(v["budget_per_day"]),
        budget_per_month=budget_text(v["budget_per_month"]),
    )


def _effective(limits: QuotaLimits) -> Callable[[QuotaField], int | None]:
    def value(field: QuotaField) -> int | None:
        found: int | None = getattr(limits, field.effective)
        return found

    return value


def _window(counted: Counted, metric: Metric, name: WindowName) -> WindowUsageOut:
    # Token and spend windows are absent when the project does not count them; the
    # bucket (and so its reset) is the request window's of the same name.
    requests = counted[("requests", name)]
    usage = counted.get((metric, name))
    if usage is None:
        return WindowUsageOut(used=None, limit=None, resets_at=requests.resets_at)
    return WindowUsageOut(used=usage.used, limit=usage.limit, resets_at=usage.resets_at)


def _money(counted: Counted, name: WindowName) -> MoneyUsageOut:
    window = _window(counted, "cost", name)
    return MoneyUsageOut(
        used=budget_text(window.used), limit=budget_text(window.limit), resets_at=window.resets_at
    )


def usage_out(counted: Counted) -> QuotaUsageOut:
    return QuotaUsageOut(
        minute=_window(counted, "requests", "minute"),
        day=_window(counted, "requests", "day"),
        month=_window(counted, "requests", "month"),
        tokens=TokenUsageOut(
            minute=_window(counted, "tokens", "minute"),
            day=_window(counted, "tokens", "day"),
            month=_window(counted, "tokens", "month"),
        ),
        spend=SpendUsageOut(day=_money(counted, "day"), month=_money(counted, "month")),
    )


async def quota_out(project_id: UUID, row: ProjectQuota | None, gate: QuotaGate) -> QuotaOut:
    limits = QuotaLimits.of(row)
    admin = QuotaValues.of_row(row, owner=False)
    owner = QuotaValues.of_row(row, owner=True)
    return QuotaOut(
        limits=limits_out(_effective(limits)),
        admin_limits=limits_out(admin.of),
        owner_limits=limits_out(owner.of),
        fail_closed=limits.fail_closed,
        currency=DEFAULT_CURRENCY,
        usage=usage_out(await gate.usage_by_metric(project_id, limits)),
    )
