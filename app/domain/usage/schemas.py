"""Bodies of the usage API (camelCase on the wire)."""

from __future__ import annotations

import datetime
from uuid import UUID

from app.domain.bodies import Camel


class UsageRecordOut(Camel):
    id: UUID
    api_key_id: UUID | None
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
    """What the call cost where it is priced (video generations)."""
    created_at: datetime.datetime


class UsageTotals(Camel):
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: int
    cost: float
    """The sum of priced calls' costs (unpriced calls count 0)."""


class UsageGroupOut(Camel):
    key: str
    """The day (``YYYY-MM-DD``, UTC) or the requested model name."""
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: int
    cost: float


class UsageSummaryOut(Camel):
    group_by: str
    items: list[UsageGroupOut]
    totals: UsageTotals
