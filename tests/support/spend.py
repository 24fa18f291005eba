"""Usage rows written straight into a test app's database, for the per-key spend
tests (the figures are read back over the API, the console and the service)."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from app.db.models import UsageRecord
from app.domain.usage.key_spend import Periods
from app.lib.settings import Settings
from tests.support.api import db_session

MICROS = 1_000_000


def usage(
    project_id: str | uuid.UUID,
    key_id: str | uuid.UUID | None,
    at: datetime.datetime,
    *,
    cost: str | None = None,
    currency: str = "USD",
    tokens: int = 0,
    status: int = 200,
) -> UsageRecord:
    """One metered call of ``key_id``; ``cost`` a decimal amount (``None``: unpriced)."""
    micros = None if cost is None else round(float(cost) * MICROS)
    return UsageRecord(
        project_id=uuid.UUID(str(project_id)),
        api_key_id=None if key_id is None else uuid.UUID(str(key_id)),
        model_requested="spend-model",
        endpoint="chat",
        status=status,
        total_tokens=tokens,
        prompt_tokens=tokens,
        cost_micros=micros,
        cost=None if micros is None else micros / MICROS,
        currency=None if micros is None else currency,
        created_at=at,
    )


async def insert(settings: Settings, rows: list[UsageRecord]) -> None:
    async with db_session(settings) as session:
        session.add_all(rows)
        await session.commit()


def moments(now: datetime.datetime) -> dict[str, Any]:
    """Times around ``now``: within today, yesterday (this month too unless today is
    the 1st: ``yesterday_in_month``), and last month."""
    periods = Periods.at(now)
    today = max(periods.day_start, now - datetime.timedelta(minutes=1))
    yesterday = periods.day_start - datetime.timedelta(hours=1)
    return {
        "today": today,
        "yesterday": yesterday,
        "yesterday_in_month": yesterday >= periods.month_start,
        "last_month": periods.month_start - datetime.timedelta(hours=1),
        "periods": periods,
    }
