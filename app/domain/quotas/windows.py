"""Which StateStore windows one call counts in, and their keys.

A project counts requests per minute, day and month (whenever it has any limit:
``GET /quota`` shows them), tokens per minute, day and month (when it has a token
limit) and spend per day and month in micro-units (when it has a budget). A key (an
API key or runtime token) counts its own requests and tokens per minute and its spend
per day or month, each only when it has that limit. Every bucket is fixed and UTC:

- minute: the clock's 60-second buckets (``[hh:mm:00, hh:mm+1:00)``);
- day: the calendar day (``[00:00, 24:00)``);
- month: the calendar month (first day 00:00 to the next month's first day).

Keys, all under the project's hash tag so that one Lua call covers a call's windows
and its hold on a Redis Cluster too::

    quota:{<project>}:m:<minute> | :d:<YYYYMMDD> | :mo:<YYYYMM>        requests
    quota:{<project>}:t:m:<minute> | :t:d:... | :t:mo:...              tokens
    quota:{<project>}:c:d:... | :c:mo:...                              spend
    quota:{<project>}:k:<credential>:m:<minute>                        key requests
    quota:{<project>}:k:<credential>:t:m:<minute>                      key tokens
    quota:{<project>}:k:<credential>:c:d:... | :c:mo:...               key spend
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from uuid import UUID

from app.domain.quotas.errors import Metric, WindowName
from app.domain.quotas.limits import QuotaLimits
from app.lib.state.base import ReserveWindow, WindowLimit

WINDOWS: tuple[WindowName, ...] = ("minute", "day", "month")
# Keys outlive their bucket by this much, so a replica whose clock runs a little
# behind still finds the bucket's count rather than a fresh key.
KEY_GRACE_SECONDS = 5.0
_SHORT: dict[WindowName, str] = {"minute": "m", "day": "d", "month": "mo"}


@dataclass(frozen=True, slots=True)
class PlannedWindow:
    name: WindowName
    key: str
    limit: int | None
    resets_at: float
    """Epoch seconds (UTC) when the bucket ends."""
    metric: Metric = "requests"
    credential_id: UUID | None = None
    """The key whose own window it is; ``None``: the project's."""

    def spec(self, now: float) -> WindowLimit:
        return WindowLimit(self.key, self.limit, self.ttl(now))

    def reserve(self, now: float, amount: int) -> ReserveWindow:
        return ReserveWindow(self.key, self.limit, self.ttl(now), amount)

    def ttl(self, now: float) -> float:
        return self.resets_at - now + KEY_GRACE_SECONDS


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """One credential's own limits (an API key's or runtime token's governance)."""

    credential_id: UUID
    rpm: int | None = None
    tpm: int | None = None
    budget_micros: int | None = None
    budget_period: WindowName = "month"

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budget_micros is not None

    @property
    def limits_usage(self) -> bool:
        """Whether a call's tokens or cost must be reserved for this key."""
        return self.tpm is not None or self.budget_micros is not None


@dataclass(frozen=True, slots=True)
class Buckets:
    """The minute, day and month buckets one instant falls in."""

    minute: int
    day: str
    month: str
    ends: dict[WindowName, float]

    @classmethod
    def at(cls, now: float) -> Buckets:
        minute = math.floor(now / 60)
        day_start = _utc(now).replace(hour=0, minute=0, second=0, microsecond=0)
        day_end = day_start + datetime.timedelta(days=1)
        if day_start.month == 12:
            month_end = day_start.replace(year=day_start.year + 1, month=1, day=1)
        else:
            month_end = day_start.replace(month=day_start.month + 1, day=1)
        return cls(
            minute=minute,
            day=f"{day_start:%Y%m%d}",
            month=f"{day_start:%Y%m}",
            ends={
                "minute": (minute + 1) * 60.0,
                "day": day_end.timestamp(),
                "month": month_end.timestamp(),
            },
        )

    def label(self, window: WindowName) -> str:
        if window == "minute":
            return str(self.minute)
        return self.day if window == "day" else self.month

    def window(
        self,
        base: str,
        name: WindowName,
        limit: int | None,
        metric: Metric,
        credential_id: UUID | None = None,
    ) -> PlannedWindow:
        infix = {"requests": "", "tokens": "t:", "cost": "c:"}[metric]
        return PlannedWindow(
            name,
            f"{base}:{infix}{_SHORT[name]}:{self.label(name)}",
            limit,
            self.ends[name],
            metric,
            credential_id,
        )


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)


def bucket_starts(now: float) -> dict[WindowName, datetime.datetime]:
    """When the minute, day and month buckets of ``now`` began (UTC)."""
    day = _utc(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return {
        "minute": _utc(math.floor(now / 60) * 60.0),
        "day": day,
        "month": day.replace(day=1),
    }


def project_base(project_id: UUID) -> str:
    return f"quota:{{{project_id}}}"


def plan_windows(project_id: UUID, limits: QuotaLimits, now: float) -> tuple[PlannedWindow, ...]:
    """The project's request windows (minute, day and month) at ``now``."""
    return request_windows(project_id, limits, Buckets.at(now))


def request_windows(
    project_id: UUID, limits: QuotaLimits, buckets: Buckets
) -> tuple[PlannedWindow, ...]:
    base = project_base(project_id)
    return (
        buckets.window(base, "minute", limits.per_minute, "requests"),
        buckets.window(base, "day", limits.per_day, "requests"),
        buckets.window(base, "month", limits.per_month, "requests"),
    )


def project_windows(
    project_id: UUID, limits: QuotaLimits, buckets: Buckets
) -> tuple[PlannedWindow, ...]:
    """Every window of the project's own that ``GET /quota`` shows: its request
    windows, then the token and spend windows its limits count."""
    return request_windows(project_id, limits, buckets) + plan_usage_windows(
        project_id, limits, buckets
    )


def plan_usage_windows(
    project_id: UUID, limits: QuotaLimits, buckets: Buckets
) -> tuple[PlannedWindow, ...]:
    """The project's token and spend windows its limits call for (none without)."""
    base = project_base(project_id)
    planned: list[PlannedWindow] = []
    if limits.limits_tokens:
        planned += [
            buckets.window(base, "minute", limits.tokens_per_minute, "tokens"),
            buckets.window(base, "day", limits.tokens_per_day, "tokens"),
            buckets.window(base, "month", limits.tokens_per_month, "tokens"),
        ]
    if limits.limits_cost:
        planned += [
            buckets.window(base, "day", limits.budget_per_day, "cost"),
            buckets.window(base, "month", limits.budget_per_month, "cost"),
        ]
    return tuple(planned)


def plan_key_windows(
    project_id: UUID, key: KeyLimits, buckets: Buckets
) -> tuple[PlannedWindow, ...]:
    """The credential's own windows, each only when it has that limit."""
    base = f"{project_base(project_id)}:k:{key.credential_id}"
    cid = key.credential_id
    planned: list[PlannedWindow] = []
    if key.rpm is not None:
        planned.append(buckets.window(base, "minute", key.rpm, "requests", cid))
    if key.tpm is not None:
        planned.append(buckets.window(base, "minute", key.tpm, "tokens", cid))
    if key.budget_micros is not None:
        period = key.budget_period
        planned.append(buckets.window(base, period, key.budget_micros, "cost", cid))
    return tuple(planned)


def plan_requests(
    project_id: UUID,
    limits: QuotaLimits,
    key: KeyLimits | None,
    buckets: Buckets,
    project_quota: bool,
) -> tuple[PlannedWindow, ...]:
    """A call's request windows: the project's (when counted) and the key's ``rpm``."""
    plan: tuple[PlannedWindow, ...] = ()
    if project_quota and not limits.unlimited:
        plan = request_windows(project_id, limits, buckets)
    if key is not None and key.rpm is not None:
        plan += tuple(
            w for w in plan_key_windows(project_id, key, buckets) if w.metric == "requests"
        )
    return plan


def plan_call(
    project_id: UUID,
    limits: QuotaLimits,
    key: KeyLimits | None,
    buckets: Buckets,
    *,
    project_quota: bool,
) -> tuple[PlannedWindow, ...]:
    """Every window a reserved call counts in: its request windows, then the
    project's token and spend windows (when counted) and the key's."""
    plan = plan_requests(project_id, limits, key, buckets, project_quota)
    if project_quota and not limits.unlimited:
        plan += plan_usage_windows(project_id, limits, buckets)
    if key is not None:
        plan += tuple(
            w for w in plan_key_windows(project_id, key, buckets) if w.metric != "requests"
        )
    return plan


MAX_CACHED_PLANS = 10_000


class PlanCache:
    """The windows of a (project, limits, key, scope) for the current minute: a call's
    plan is the same as the previous call's of the same caller until the minute (and
    so possibly the day or month) turns, so it is built once a minute, not per call.
    Keys carry the limits themselves, so a changed limit is a new entry."""

    __slots__ = ("_buckets", "_minute", "_plans")

    def __init__(self) -> None:
        self._minute = -1
        self._buckets: Buckets | None = None
        self._plans: dict[Hashable, tuple[PlannedWindow, ...]] = {}

    def plan(
        self,
        key: Hashable,
        now: float,
        build: Callable[[Buckets], tuple[PlannedWindow, ...]],
    ) -> tuple[PlannedWindow, ...]:
        minute = math.floor(now / 60)
        if minute != self._minute or self._buckets is None:
            self._minute, self._buckets = minute, Buckets.at(now)
            self._plans.clear()
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_CACHED_PLANS:
                self._plans.clear()
            plan = self._plans[key] = build(self._buckets)
        return plan
