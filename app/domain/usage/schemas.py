"""Bodies of the usage API (camelCase on the wire)."""

from __future__ import annotations

import datetime
from typing import Literal
from uuid import UUID

from app.domain.bodies import Camel


class UsageRecordOut(Camel):
    id: UUID
    api_key_id: UUID | None
    """The API key that made the call, or the runtime token (runtime chats)."""
    user_id: UUID | None
    model_requested: str
    model_served: str | None
    backend: str | None
    endpoint: str
    streamed: bool
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    estimated: bool
    status: int
    error_code: str | None
    latency_ms: int
    ttft_ms: int | None
    conversation_id: str | None
    model_profile_id: str | None
    is_custom: bool
    is_override_key: bool
    cost: float | None
    """What the call cost in ``currency`` (None: unpriced); ``costMicros`` exactly."""
    cost_micros: int | None
    """The cost in micro-units of ``currency`` (1 = 0.000001)."""
    currency: str | None
    cost_estimated: bool
    """Priced from estimated usage (the upstream reported none)."""
    created_at: datetime.datetime


class UsageTotals(Camel):
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: int
    cost: float
    """The sum of priced calls' costs (unpriced calls count 0)."""
    cost_micros: int
    """The same sum, exact, in micro-units."""
    currency: str | None
    """The currency of the priced calls; null when none is priced or they are priced in
    several currencies (then the sums add amounts of different currencies)."""
    cost_estimated: bool
    """Whether any of the summed costs was priced from estimated usage."""


class UsageGroupOut(Camel):
    key: str | None
    """The day (``YYYY-MM-DD``, UTC), the requested model, the profile id, the backend,
    the API key id (or runtime token id) or the conversation id; null for calls
    without one."""
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: int
    cost: float
    cost_micros: int
    currency: str | None
    cost_estimated: bool


class UsageSummaryOut(Camel):
    group_by: str
    items: list[UsageGroupOut]
    totals: UsageTotals


class ProjectSpendOut(Camel):
    """One project's usage and spend (``GET /api/admin/usage/projects``)."""

    project_id: UUID | None
    """Null: calls no project paid for."""
    project_name: str | None
    """Null for a deleted project (its usage stays) or no project."""
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: int
    cost: float
    cost_micros: int
    currency: str | None
    cost_estimated: bool


class SpendFigures(Camel):
    """A credential's usage over a period: priced spend and what it was spent on."""

    amount: str
    """The spend in ``currency`` as an exact decimal (``"3.2"``); ``"0"`` when nothing
    was priced."""
    currency: str | None
    """The leading currency (the largest amount); null when nothing was priced."""
    by_currency: dict[str, str]
    """Every currency's amount (prices may be in several; they are never added up)."""
    tokens: int
    requests: int
    """Every metered call, refused ones included."""


class SpendOut(Camel):
    """What an API key or runtime token spent in its budget period (the UTC calendar
    ``day`` or ``month``; ``month`` without a budget), against its budget."""

    period: Literal["day", "month"]
    period_start: datetime.datetime
    amount: str
    currency: str | None
    by_currency: dict[str, str]
    tokens: int
    requests: int
    budget: str | None
    """The key's budget for ``period`` (null: none)."""
    budget_used_percent: float | None
    """``amount`` as a percentage of ``budget`` (over 100 past it); null without one."""
    today: SpendFigures
    """The same figures for the current UTC day."""
