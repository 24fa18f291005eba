"""Bodies of the quota API (camelCase on the wire)."""

from __future__ import annotations

import datetime
from typing import Annotated

import msgspec

from app.domain.bodies import Camel, Strict

# The columns are 32-bit integers.
MAX_LIMIT = 2_147_483_647
Limit = Annotated[int, msgspec.Meta(ge=0, le=MAX_LIMIT)]


class AdminQuotaIn(Strict):
    """``PUT /api/admin/projects/{projectId}/quota``: the ceilings (replaced as a
    whole: an absent window is ``null``, no limit). ``failClosed`` absent: unchanged."""

    per_minute: Limit | None = None
    per_day: Limit | None = None
    per_month: Limit | None = None
    fail_closed: bool | msgspec.UnsetType = msgspec.UNSET


class OwnerQuotaIn(Strict):
    """``PUT /api/projects/{projectId}/quota``: the owner's own lower limits (replaced
    as a whole; ``null`` or absent: the admin ceiling alone applies)."""

    per_minute: Limit | None = None
    per_day: Limit | None = None
    per_month: Limit | None = None


class LimitsOut(Camel):
    per_minute: int | None
    per_day: int | None
    per_month: int | None


class WindowUsageOut(Camel):
    used: int | None
    """Requests admitted in the current window (``null``: the state store is down)."""
    limit: int | None
    resets_at: datetime.datetime


class QuotaUsageOut(Camel):
    minute: WindowUsageOut
    day: WindowUsageOut
    month: WindowUsageOut


class QuotaOut(Camel):
    limits: LimitsOut
    """What applies: per window the lower of the admin and the owner limit."""
    admin_limits: LimitsOut
    owner_limits: LimitsOut
    fail_closed: bool
    usage: QuotaUsageOut
