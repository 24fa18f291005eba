"""The quota gate: one atomic admission per call, before the upstream call.

What ``CallAdmission`` calls (``resources.quota_gate``, the ``quota_gate`` dependency)::

    hold = await quota_gate.reserve(project_id, key_limits, estimate)  # or raises
    ...                                  # the call runs
    await hold.settle(tokens, cost)      # the meter, when the call is metered

``check(project_id, key_limits)`` is the request-only admission (video jobs, and what
``reserve`` does when no token limit or budget applies). Built per process by
``QuotasWiring``, with the limits cache kept current over the EventBus by
``QuotaSync`` and the threshold alerts of ``BudgetAlerts``.

What is counted (``app.domain.quotas.windows`` has the windows and their keys):

- requests per minute, day and month of the project (whenever it has any limit; a
  request counts when admitted, whether or not the upstream then succeeds), and of
  the key per minute (``rpm``);
- tokens per minute, day and month of the project, and of the key per minute
  (``tpm``), held at the call's estimate and settled to its actual tokens;
- spend per day and month of the project, and of the key per its budget period,
  in micro-units, held at the estimated cost and settled to the actual cost.

Traffic outside the project's quota (a project's own custom LLM, its BYO override
key) counts only in its key's windows.

Every window of a call is admitted in one atomic StateStore step (``admit_windows``,
or ``reserve`` when tokens or spend are held): all counted or none, so concurrent
calls on any number of replicas never push a window past its limit by more than
what the calls in flight turn out to use beyond their estimates.

Raises (``AronaError``: Litestar's handlers and the ``/v1`` raw handlers render the
one error shape with ``exc.headers``; a stream must be admitted before its first byte):

- ``QuotaExceededError`` (429) with ``Retry-After`` = seconds until the refusing
  window resets (at least 1): code ``budget_exceeded``, ``token_limit_exceeded``,
  ``rate_limit_exceeded`` (a request minute window) or ``quota_exceeded`` (a request
  day or month window). When several are full, the one resetting last is reported.
- ``QuotaUnavailableError`` (503 ``quota_unavailable``, ``Retry-After: 5``) when the
  state store cannot be reached and the project is fail-closed; fail-open (default)
  admits the call uncounted. Also raised (``Retry-After: 1``) when a project's limits
  were never loaded and the database cannot be read.

Limits come from ``QuotaLimitsCache``: no database query per call in steady state. A
project without any limit, called by a key without any, costs no StateStore call.
Store failures are counted (``arona_quota_store_failures_total{policy}``) and logged
at most once per ``log_interval`` seconds with the number held back.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import structlog
from prometheus_client import CollectorRegistry, Counter

from app.domain.quotas.alerts import BudgetAlerts
from app.domain.quotas.errors import (
    Metric,
    QuotaExceededError,
    QuotaUnavailableError,
    WindowName,
)
from app.domain.quotas.holds import CallHold, Hold, HoldFailures, HoldKeeper, SettleBatch
from app.domain.quotas.leases import Leases
from app.domain.quotas.limits import QuotaLimits, QuotaLimitsCache
from app.domain.quotas.refusals import quota_exceeded, refusing_window
from app.domain.quotas.seeding import Counted, raise_to_used
from app.domain.quotas.windows import (
    Buckets,
    KeyLimits,
    PlanCache,
    PlannedWindow,
    plan_call,
    plan_requests,
    plan_windows,
    project_base,
    project_windows,
)
from app.lib.log_budget import RepeatBudget
from app.lib.state.base import MultiWindowDecision, StateStore

__all__ = [
    "CallEstimate",
    "KeyLimits",
    "QuotaExceededError",
    "QuotaGate",
    "QuotaUnavailableError",
    "WindowName",
    "WindowUsage",
    "plan_windows",
]

logger = structlog.get_logger()

FAIL_CLOSED_RETRY_AFTER = 5
DEFAULT_LOG_INTERVAL = 60.0
DEFAULT_HOLD_TTL = 120.0
"""Seconds a call's reservation lives unless extended: how soon a killed replica's
in-flight units come back (a live call extends its hold every half of it)."""

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class CallEstimate:
    """What a call may use at most, as admission reserves it."""

    tokens: int
    cost_micros: int


EstimateOf = Callable[[], Awaitable[CallEstimate]]


@dataclass(frozen=True, slots=True)
class WindowUsage:
    used: int | None
    """Units counted in the current bucket, in-flight reservations included;
    ``None`` when the store is unreachable or the window is not counted."""
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
        hold_ttl: float = DEFAULT_HOLD_TTL,
        alerts: BudgetAlerts | None = None,
    ) -> None:
        """``clock`` is wall-clock epoch seconds (tests pass a fake one to cross
        windows); ``registry`` gets the gate's Prometheus counters when given;
        ``alerts`` raises the 80 % / 100 % threshold alerts."""
        self._store = store
        self.limits = limits
        self._clock = clock
        self._warnings = RepeatBudget(interval=log_interval)
        self.hold_ttl = hold_ttl
        self.alerts = alerts
        # Hold ids: a random prefix per gate (unique across replicas and restarts) and
        # a serial, instead of a uuid4 per call (an os.urandom syscall each).
        self._hold_prefix = secrets.token_hex(8)
        self._hold_serial = itertools.count()
        self.store_failures = 0
        """StateStore errors seen by ``check``, ``reserve`` and ``usage`` (a metric too)."""
        self.refusals = 0
        self._failure_metric: dict[bool, Any] = {}
        self._refusal_metric: Any | None = None
        settle_metric = None
        if registry is not None:
            failures = Counter(
                "arona_quota_store_failures_total",
                "Quota checks the state store could not answer, by the policy applied.",
                ("policy",),
                registry=registry,
            )
            self._refusal_metric = Counter(
                "arona_quota_refusals_total",
                "Requests refused by a limit, by window, what it counts and whose it is.",
                ("window", "metric", "scope"),
                registry=registry,
            )
            settle_metric = Counter(
                "arona_quota_settle_failures_total",
                "Reservations the state store could not settle, extend or release.",
                registry=registry,
            )
            self._failure_metric = {
                False: failures.labels("fail_open"),
                True: failures.labels("fail_closed"),
            }
        self.hold_failures = HoldFailures(settle_metric, log_interval)
        self._settles = SettleBatch(store, self.hold_failures, clock)
        self.hold_keeper = HoldKeeper(store, hold_ttl, self.hold_failures)
        self.leases = Leases(self._settles, self.hold_keeper)
        self._plans = PlanCache()

    async def check(
        self, project_id: UUID, key: KeyLimits | None = None, *, project_quota: bool = True
    ) -> None:
        """Admit one request of ``project_id`` or raise (see the module docstring),
        counting requests only: the key's ``rpm`` and the project's request windows.

        ``key``: the calling credential's limits; only its ``rpm`` is counted here,
        in the same atomic step (both counted, or neither). ``project_quota=False``
        checks only that (a custom LLM or override-key call is outside the project's
        quota but not outside its key's rate)."""
        limits = await self.limits.get(project_id)
        if (not project_quota or limits.unlimited) and (key is None or key.rpm is None):
            return
        now = self._clock()
        plan = self._plans.plan(
            (project_id, limits, key, project_quota, "requests"),
            now,
            lambda buckets: plan_requests(project_id, limits, key, buckets, project_quota),
        )
        if not plan:
            return
        try:
            decision = await self._store.admit_windows([w.spec(now) for w in plan])
        except Exception as exc:
            self._store_failed(project_id, limits, exc)
            return
        if not decision.allowed:
            raise self._refusal(project_id, plan, decision, now)

    async def reserve(
        self,
        project_id: UUID,
        key: KeyLimits | None,
        estimate: EstimateOf,
        *,
        project_quota: bool = True,
    ) -> CallHold | None:
        """Admit one call or raise, holding its estimated tokens and cost in every
        window that limits them, in one atomic step with its request windows (or, while
        the caller's windows have plenty of room, from a lease of this replica: see
        ``app.domain.quotas.leases``).

        ``estimate`` is awaited only when some window counts tokens or cost. Returns
        the hold to settle when the call is over (``Hold.settle``), or ``None`` when
        nothing was held (no token or money limit applies: then this is ``check``).
        Raises ``QuotaExceededError`` (429: ``budget_exceeded``,
        ``token_limit_exceeded``, ``quota_exceeded`` or ``rate_limit_exceeded``) or,
        fail-closed with the store away, ``QuotaUnavailableError``."""
        limits = await self.limits.get(project_id)
        counts_project = project_quota and not limits.unlimited
        if not (counts_project and (limits.limits_tokens or limits.limits_cost)) and not (
            key is not None and key.limits_usage
        ):
            await self.check(project_id, key, project_quota=project_quota)
            return None
        now = self._clock()
        plan = self._plans.plan(
            (project_id, limits, key, project_quota),
            now,
            lambda buckets: plan_call(
                project_id, limits, key, buckets, project_quota=project_quota
            ),
        )
        wanted = await estimate()
        # One amount per metric, picked by each window's (the plan's are few and fixed).
        by_metric = {"requests": 1, "tokens": wanted.tokens, "cost": wanted.cost_micros}
        amounts = [by_metric[w.metric] for w in plan]
        leased = self.leases.take(plan, amounts)
        if leased is not None:
            return leased
        for _ in range(_LEASE_WAITS):
            waiting = self.leases.pending(plan)
            if waiting is None:
                break
            await asyncio.wait((waiting,))  # not cancelled with this call
            leased = self.leases.take(plan, amounts)
            if leased is not None:
                return leased
        calls = self.leases.calls_to_reserve(plan)
        if calls > 1 and self.leases.pending(plan) is not None:
            calls = 1  # another lease is on its way and this call waited enough
        lease_wait = self.leases.begin(plan) if calls > 1 else None
        try:
            decision = await self._reserve(project_id, limits, plan, amounts, calls, now)
            if decision is not None and not decision[1].allowed and calls > 1:
                # No room for a lease: the call alone, as near a limit every call is.
                self.leases.learn(plan, amounts, decision[1])
                calls = 1
                decision = await self._reserve(project_id, limits, plan, amounts, calls, now)
            if decision is None:
                return None  # the store failed; fail-open admits the call uncounted
            hold_id, answer = decision
            if not answer.allowed:
                raise self._refusal(project_id, plan, answer, now, amounts)
            if self.alerts is not None:
                self.alerts.observe(project_id, plan, [w.current for w in answer.windows], now)
            self.leases.learn(plan, amounts, answer)
            if calls > 1:
                return self.leases.open(plan, hold_id, amounts, calls)
        finally:
            if lease_wait is not None:
                self.leases.end(plan, lease_wait)
        return Hold(
            self._store,
            hold_id,
            plan,
            amounts,
            keeper=self.hold_keeper,
            clock=self._clock,
            failures=self.hold_failures,
            batch=self._settles,
        )

    async def _reserve(
        self,
        project_id: UUID,
        limits: QuotaLimits,
        plan: Sequence[PlannedWindow],
        amounts: Sequence[int],
        calls: int,
        now: float,
    ) -> tuple[str, MultiWindowDecision] | None:
        """One reservation of ``calls`` calls of ``amounts``: its hold id and the
        store's answer; None when the store failed and the project is fail-open
        (fail-closed raises)."""
        hold_id = f"{project_base(project_id)}:h:{self._hold_prefix}{next(self._hold_serial):x}"
        try:
            answer = await self._store.reserve(
                [w.reserve(now, a * calls) for w, a in zip(plan, amounts, strict=True)],
                hold_id,
                self.hold_ttl,
            )
        except Exception as exc:
            self._store_failed(project_id, limits, exc)
            return None
        return hold_id, answer

    async def seed(
        self,
        project_id: UUID,
        limits: QuotaLimits,
        windows: Counted,
        used: Mapping[tuple[Metric, WindowName], int],
    ) -> None:
        """Raise each of the project's ``windows`` (just started being counted) to at
        least what ``used`` says its bucket already used (``app.domain.quotas.seeding``);
        never raises: an unreachable store leaves them counting from now."""
        now = self._clock()
        plan = project_windows(project_id, limits, Buckets.at(now))
        try:
            await raise_to_used(self._store, plan, windows, used, now)
        except Exception as exc:
            self.store_failures += 1
            self._warn("could not seed a quota window from usage", project_id, exc)

    async def drain(self) -> None:
        """Send the settles queued now and wait for them; extend no hold any more
        (shutdown)."""
        self.leases.close_all()
        self.hold_keeper.stop()
        await self._settles.drain()

    async def usage(self, project_id: UUID, limits: QuotaLimits) -> dict[WindowName, WindowUsage]:
        """The request windows' counts now (minute, day, month); read only."""
        counted = await self.usage_by_metric(project_id, limits)
        return {name: use for (metric, name), use in counted.items() if metric == "requests"}

    async def usage_by_metric(
        self, project_id: UUID, limits: QuotaLimits
    ) -> dict[tuple[Metric, WindowName], WindowUsage]:
        """What ``GET /quota`` shows: the current buckets' counts, in-flight
        reservations included; read only. Requests always; tokens and spend for the
        windows the project's limits make it count (the others are absent)."""
        plan = project_windows(project_id, limits, Buckets.at(self._clock()))
        used: list[int | None]
        try:
            totals = await asyncio.gather(*(self._store.window_total(w.key) for w in plan))
            used = [t.total for t in totals]
        except Exception as exc:
            self.store_failures += 1
            self._warn("quota usage unavailable: the state store failed", project_id, exc)
            used = [None] * len(plan)
        return {
            (w.metric, w.name): WindowUsage(n, w.limit, _utc(w.resets_at))
            for w, n in zip(plan, used, strict=True)
        }

    def _refusal(
        self,
        project_id: UUID,
        plan: Sequence[PlannedWindow],
        decision: MultiWindowDecision,
        now: float,
        amounts: Sequence[int] | None = None,
    ) -> QuotaExceededError:
        full = [
            (w, count.current, 1 if amounts is None else amounts[i])
            for i, (w, count) in enumerate(zip(plan, decision.windows, strict=True))
            if not count.fits
        ]
        if self.alerts is not None:
            # A full day or month window is its 100 % alert (raised once).
            self.alerts.observe(
                project_id,
                [w for w, _, _ in full],
                [max(used, w.limit or 0) for w, used, _ in full],
                now,
            )
        window, amount = refusing_window(full)
        self.refusals += 1
        if self._refusal_metric is not None:
            scope = "project" if window.credential_id is None else "key"
            self._refusal_metric.labels(window.name, window.metric, scope).inc()
        return quota_exceeded(window, amount, now)

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


_LEASE_WAITS = 4
"""How many leases being reserved a call waits for before it reserves alone."""


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)
