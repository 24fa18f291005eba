"""Bodies of the quota API (camelCase on the wire).

Request and token limits are whole numbers; budgets are money, written as decimal
text (``"25.50"``) or a JSON number, at most 6 decimals, in the price book's currency
(``currency`` in the answer). Their types are loose here on purpose: ``read_limits``
(``app.domain.quotas.fields``) checks each and names the field in the 400.
"""

from __future__ import annotations

import datetime
from typing import Annotated

import msgspec

from app.domain.bodies import Camel, Strict
from app.domain.quotas.fields import MAX_REQUESTS, MAX_TOKENS

MAX_LIMIT = MAX_REQUESTS
Limit = Annotated[int, msgspec.Meta(ge=0, le=MAX_LIMIT)]
TokenLimit = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
Money = str | int | float
"""A decimal amount; checked by ``read_limits`` (at most 6 decimals, not negative)."""


class AdminQuotaIn(Strict):
    """``PUT /api/admin/projects/{projectId}/quota``: the ceilings (replaced as a
    whole: an absent window is ``null``, no limit). ``failClosed`` absent: unchanged."""

    per_minute: Limit | None = None
    per_day: Limit | None = None
    per_month: Limit | None = None
    fail_closed: bool | msgspec.UnsetType = msgspec.UNSET
    tokens_per_minute: TokenLimit | None = None
    tokens_per_day: TokenLimit | None = None
    tokens_per_month: TokenLimit | None = None
    budget_per_day: Money | None = None
    budget_per_month: Money | None = None


class OwnerQuotaIn(Strict):
    """``PUT /api/projects/{projectId}/quota``: the owner's own lower limits (replaced
    as a whole; ``null`` or absent: the admin ceiling alone applies)."""

    per_minute: Limit | None = None
    per_day: Limit | None = None
    per_month: Limit | None = None
    tokens_per_minute: TokenLimit | None = None
    tokens_per_day: TokenLimit | None = None
    tokens_per_month: TokenLimit | None = None
    budget_per_day: Money | None = None
    budget_per_month: Money | None = None


def limits_sent(data: AdminQuotaIn | OwnerQuotaIn) -> dict[str, object]:
    """The body's limits by wire name, for ``read_limits``."""
    return {
        "perMinute": data.per_minute,
        "perDay": data.per_day,
        "perMonth": data.per_month,
        "tokensPerMinute": data.tokens_per_minute,
        "tokensPerDay": data.tokens_per_day,
        "tokensPerMonth": data.tokens_per_month,
        "budgetPerDay": data.budget_per_day,
        "budgetPerMonth": data.budget_per_month,
    }


class LimitsOut(Camel):
    per_minute: int | None
    per_day: int | None
    per_month: int | None
    tokens_per_minute: int | None
    tokens_per_day: int | None
    tokens_per_month: int | None
    budget_per_day: str | None
    """Exact decimal text in ``currency`` (``"25.5"``); ``null``: no budget."""
    budget_per_month: str | None


class WindowUsageOut(Camel):
    used: int | None
    """Units counted in the current window, in-flight reservations included.
    ``null``: not known: the state store is unreachable or, for tokens, the project
    has no token limit (tokens are counted only while one is set)."""
    limit: int | None
    resets_at: datetime.datetime


class MoneyUsageOut(Camel):
    used: str | None
    """Spend in the current window (exact decimal text in ``currency``), running
    calls counted at their reservation. ``null``: the state store is unreachable or
    the project has no budget (spend is counted here only while one is set; the
    usage records have it always)."""
    limit: str | None
    resets_at: datetime.datetime


class TokenUsageOut(Camel):
    minute: WindowUsageOut
    day: WindowUsageOut
    month: WindowUsageOut


class SpendUsageOut(Camel):
    day: MoneyUsageOut
    month: MoneyUsageOut


class QuotaUsageOut(Camel):
    minute: WindowUsageOut
    """Requests (``minute``, ``day``, ``month``), as before tokens and spend existed."""
    day: WindowUsageOut
    month: WindowUsageOut
    tokens: TokenUsageOut
    spend: SpendUsageOut


class QuotaOut(Camel):
    limits: LimitsOut
    """What applies: per window the lower of the admin and the owner limit."""
    admin_limits: LimitsOut
    owner_limits: LimitsOut
    fail_closed: bool
    currency: str
    """What budgets and spend are counted in (the price book's default)."""
    usage: QuotaUsageOut
