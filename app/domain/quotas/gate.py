"""The quota gate: one atomic admission per request, before the upstream call.

What the ``/v1`` gateway and the runtime chat call (``resources.quota_gate``, the
``quota_gate`` dependency)::

    await quota_gate.check(project_id)   # -> None, or raises (see below)

It is built once per process in ``build_resources``::

    quota_sync = QuotaSync(QuotaLimitsCache(db_limits_loader(db_config)), event_bus)
    quota_gate = QuotaGate(state_store, quota_sync.cache, registry=metrics.registry)

and the lifespan runs ``quota_sync.run`` (the EventBus follower). Nothing else needs
wiring: the quota API invalidates the cache through ``quota_sync.project_changed``.

Call it once per request that counts against the project's quota, after the caller
is authenticated and before any upstream call. Traffic outside the quota is not
checked: a project's own custom LLM (``custom:<name>``) and calls made with its BYO
override key (``UsageEntry.is_custom`` / ``is_override_key``).

Raises (both ``AronaError``, so Litestar's handlers render the one error shape and
copy ``exc.headers``; a stream must call ``check`` before its first byte):

- ``QuotaExceededError`` (``RateLimitedError``, 429) with ``Retry-After`` = whole
  seconds until the refusing window resets (rounded up, at least 1): code
  ``rate_limit_exceeded`` when the minute window is full, ``quota_exceeded`` when the
  day or month window is. When several are full the one resetting last is reported
  (that is when a retry can succeed). ``exc.window`` names it.
- ``QuotaUnavailableError`` (``ServiceUnavailableError``, 503 ``quota_unavailable``,
  ``Retry-After: 5``) when the state store cannot be reached and the project is
  fail-closed. A 503, not a 429: the client did nothing wrong and its quota is not
  used up. Also raised (``Retry-After: 1``, whatever the policy) in the rare case a
  project's limits were never loaded and the database cannot be read
  (``QuotaLimitsCache.get``; a previously loaded entry is served stale instead).

Windows (all fixed, UTC, counted per project):

- minute: the clock's 60-second buckets (``[hh:mm:00, hh:mm+1:00)``);
- day: the calendar day in UTC (``[00:00, 24:00)``);
- month: the calendar month in UTC (first day 00:00 to the next month's first day).

Each bucket is its own StateStore key (``quota:{<project>}:m|d|mo:<bucket>``, the hash
tag keeping a project's keys on one Redis Cluster slot), created with a TTL a few
seconds past the bucket's end; replicas agree on buckets as far as their clocks do.

Admission is a reservation: ``StateStore.admit_windows`` adds 1 to the minute, day and
month counters in one atomic step if every limited window has room, and changes
nothing otherwise, so concurrent requests on any number of replicas never overshoot a
limit. Windows without a limit are counted too (that is what ``GET /quota`` shows, and
a limit set mid-day applies to the day's traffic so far). There is no ``release``: a
request counts when it is admitted, whether or not the upstream call then succeeds.

Limits come from ``QuotaLimitsCache`` (in process, invalidated over the EventBus by
``QuotaSync``): no database query per request in steady state. A project without any
limit costs no StateStore call at all.

When the state store raises (Redis down, timeouts), the project's ``fail_closed``
decides: fail-open (default) admits the request uncounted, fail-closed refuses with
503. Either way a warning is logged at most once per ``log_interval`` seconds per
process (with the number of failures in between) and
``arona_quota_store_failures_total{policy}`` is counted.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import structlog
from prometheus_client import CollectorRegistry, Counter

from app.domain.quotas.errors import QuotaExceededError, QuotaUnavailableError, WindowName
from app.domain.quotas.limits import QuotaLimits, QuotaLimitsCache
from app.lib.log_budget import RepeatBudget
from app.lib.state.base import MultiWindowDecision, StateStore, WindowLimit

__all__ = [
    "KeyRate",
    "QuotaExceededError",
    "QuotaGate",
    "QuotaUnavailableError",
    "WindowName",
    "WindowUsage",
    "plan_windows",
]

logger = structlog.get_logger()

WINDOWS: tuple[WindowName, ...] = ("minute", "day", "month")
# Keys outlive their bucket by this much, so a replica whose clock runs a little
# behind still finds the bucket's count rather than a fresh key.
KEY_GRACE_SECONDS = 5.0
FAIL_CLOSED_RETRY_AFTER = 5
DEFAULT_LOG_INTERVAL = 60.0

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class PlannedWindow:
    name: WindowName
    key: str
    limit: int | None
    resets_at: float
    """Epoch seconds (UTC) when the bucket ends."""

    def spec(self, now: float) -> WindowLimit:
        return WindowLimit(self.key, self.limit, self.resets_at - now + KEY_GRACE_SECONDS)


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)


def plan_windows(project_id: UUID, limits: QuotaLimits, now: float) -> tuple[PlannedWindow, ...]:
    """The minute, day and month buckets ``now`` (epoch seconds) falls in."""
    minute = math.floor(now / 60)
    day_start = _utc(now).replace(hour=0, minute=0, second=0, microsecond=0)
    day_end = day_start + datetime.timedelta(days=1)
    if day_start.month == 12:
        month_end = day_start.replace(year=day_start.year + 1, month=1, day=1)
    else:
        month_end = day_start.replace(month=day_start.month + 1, day=1)
    base = f"quota:{{{project_id}}}"
    return (
        PlannedWindow("minute", f"{base}:m:{minute}", limits.per_minute, (minute + 1) * 60.0),
        PlannedWindow("day", f"{base}:d:{day_start:%Y%m%d}", limits.per_day, day_end.timestamp()),
        PlannedWindow(
            "month", f"{base}:mo:{day_start:%Y%m}", limits.per_month, month_end.timestamp()
        ),
    )


@dataclass(frozen=True, slots=True)
class KeyRate:
    """One credential's requests-per-minute limit (an API key's or runtime token's
    ``rpm``), counted in the same atomic admission as its project's quota."""

    credential_id: UUID
    per_minute: int


def key_window(project_id: UUID, rate: KeyRate, now: float) -> PlannedWindow:
    """The credential's minute bucket; under the project's hash tag, so one Lua call
    covers it and the project's windows on a Redis Cluster too."""
    minute = math.floor(now / 60)
    return PlannedWindow(
        "minute",
        f"quota:{{{project_id}}}:k:{rate.credential_id}:m:{minute}",
        rate.per_minute,
        (minute + 1) * 60.0,
    )


@dataclass(frozen=True, slots=True)
class WindowUsage:
    used: int | None
    """Requests admitted in the current bucket; ``None`` when the store is unreachable."""
    limit: int | None
    resets_at: datetime.datetime


class QuotaGate:
    def __init__(
        self,
        store: StateStore,
        limits: QuotaLimitsCache,
        *,
        clock: Clock = time.time,
        registry: CollectorRegistry | None = None,
        log_interval: float = DEFAULT_LOG_INTERVAL,
    ) -> None:
        """``clock`` is wall-clock epoch seconds (tests pass a fake one to cross
        windows); ``registry`` gets the gate's Prometheus counters when given."""
        self._store = store
        self.limits = limits
        self._clock = clock
        self._warnings = RepeatBudget(interval=log_interval)
        self.store_failures = 0
        """StateStore errors seen by ``check`` and ``usage`` (also a metric)."""
        self.refusals = 0
        self._failure_metric: dict[bool, Any] = {}
        self._refusal_metric: dict[str, Any] = {}
        if registry is not None:
            failures = Counter(
                "arona_quota_store_failures_total",
                "Quota checks the state store could not answer, by the policy applied.",
                ("policy",),
                registry=registry,
            )
            refusals = Counter(
                "arona_quota_refusals_total",
                "Requests refused by a project quota, by window.",
                ("window",),
                registry=registry,
            )
            self._failure_metric = {
                False: failures.labels("fail_open"),
                True: failures.labels("fail_closed"),
            }
            self._refusal_metric = {
                name: refusals.labels(name) for name in (*WINDOWS, "key_minute")
            }

    async def check(
        self, project_id: UUID, key: KeyRate | None = None, *, project_quota: bool = True
    ) -> None:
        """Admit one request of ``project_id`` or raise (see the module docstring).

        ``key``: the calling credential's own per-minute limit, admitted in the same
        atomic step (both counted, or neither). ``project_quota=False`` checks only
        that (a custom LLM or override-key call is outside the project's quota but
        not outside its key's rate)."""
        limits = await self.limits.get(project_id)
        counts_project = project_quota and not limits.unlimited
        if not counts_project and key is None:
            return
        now = self._clock()
        plan = plan_windows(project_id, limits, now) if counts_project else ()
        if key is not None:
            plan = (*plan, key_window(project_id, key, now))
        try:
            decision = await self._store.admit_windows([w.spec(now) for w in plan])
        except Exception as exc:
            self._store_failed(project_id, limits, exc)
            return
        if not decision.allowed:
            if key is not None and all(w.fits for w in decision.windows[:-1]):
                raise self._key_refusal(key, now, plan[-1])
            if key is not None:
                plan, decision = plan[:-1], _without_last(decision)
            raise self._refusal(plan, decision, now)

    def _key_refusal(self, key: KeyRate, now: float, window: PlannedWindow) -> QuotaExceededError:
        self.refusals += 1
        metric = self._refusal_metric.get("key_minute")
        if metric is not None:
            metric.inc()
        wait = window.resets_at - now
        return QuotaExceededError(
            f"this credential is limited to {key.per_minute} requests per minute; "
            f"retry in {math.ceil(wait)} s",
            window="minute",
            limit=key.per_minute,
            retry_after=wait,
        )

    async def usage(self, project_id: UUID, limits: QuotaLimits) -> dict[WindowName, WindowUsage]:
        """The current buckets' counts (what ``GET /quota`` shows); read only."""
        plan = plan_windows(project_id, limits, self._clock())
        used: list[int | None]
        try:
            raw = await asyncio.gather(*(self._store.get(w.key) for w in plan))
            used = [0 if value is None else int(value) for value in raw]
        except Exception as exc:
            self.store_failures += 1
            self._warn("quota usage unavailable: the state store failed", project_id, exc)
            used = [None] * len(plan)
        return {
            w.name: WindowUsage(n, w.limit, _utc(w.resets_at))
            for w, n in zip(plan, used, strict=True)
        }

    def _refusal(
        self, plan: tuple[PlannedWindow, ...], decision: MultiWindowDecision, now: float
    ) -> QuotaExceededError:
        full = [w for w, count in zip(plan, decision.windows, strict=True) if not count.fits]
        # The latest reset; on a tie the longer window (the quota, not the rate).
        window = max(full, key=lambda w: (w.resets_at, WINDOWS.index(w.name)))
        assert window.limit is not None  # only limited windows can be full
        self.refusals += 1
        metric = self._refusal_metric.get(window.name)
        if metric is not None:
            metric.inc()
        retry_after = window.resets_at - now
        resets = _utc(window.resets_at).isoformat().replace("+00:00", "Z")
        if window.name == "minute":
            message = (
                f"this project is limited to {window.limit} requests per minute; "
                f"retry in {math.ceil(retry_after)} s"
            )
        else:
            message = (
                f"this project's quota of {window.limit} requests per {window.name} is "
                f"used up; it resets at {resets}"
            )
        return QuotaExceededError(
            message, window=window.name, limit=window.limit, retry_after=retry_after
        )

    def _store_failed(self, project_id: UUID, limits: QuotaLimits, exc: Exception) -> None:
        self.store_failures += 1
        metric = self._failure_metric.get(limits.fail_closed)
        if metric is not None:
            metric.inc()
        if limits.fail_closed:
            self._warn("quota check failed; refusing (fail-closed)", project_id, exc)
            raise QuotaUnavailableError(
                "the quota of this project cannot be checked right now; try again shortly",
                headers={"Retry-After": str(FAIL_CLOSED_RETRY_AFTER)},
            ) from exc
        self._warn("quota check failed; admitting unchecked (fail-open)", project_id, exc)

    def _warn(self, message: str, project_id: UUID, exc: Exception) -> None:
        held = self._warnings.admit("store")
        if held is not None:
            logger.warning(
                message,
                project_id=str(project_id),
                error=repr(exc),
                failures_not_logged=held,
                failures_total=self.store_failures,
            )


def _without_last(decision: MultiWindowDecision) -> MultiWindowDecision:
    return MultiWindowDecision(decision.allowed, decision.windows[:-1])
