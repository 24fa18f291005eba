"""Windows that start being counted begin at what the bucket already used.

A project's windows are counted only while a limit asks for them (a project without
any limit costs no StateStore call per request). Without seeding, a limit set at noon
would count from noon: the quota page's "used" would say 7 where the same page's
usage says 70, and a day limit of 50 set after 70 calls would still admit 50 more.
So when a change makes windows counted that were not (``newly_counted``), the
service reads what the project's usage records already hold for their current
buckets (``ProjectQuotaService.used_since``: calls admitted into the project's quota,
their tokens and cost) and the gate raises each such window to at least that
(``QuotaGate.seed``).

Usage records reach the database through the write-ahead path a second or so after
their call; calls of that last moment, and calls admitted between the change and
the moment every replica applies it, can be missing from the seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.quotas.errors import Metric, WindowName
from app.domain.quotas.limits import QuotaLimits
from app.domain.quotas.windows import WINDOWS, PlannedWindow
from app.lib.state.base import StateStore

ADMISSION_REFUSALS = (
    "rate_limit_exceeded",
    "quota_exceeded",
    "token_limit_exceeded",
    "budget_exceeded",
    "quota_unavailable",
    "model_not_allowed",
)
"""Error codes of calls refused at admission: metered, but never counted in a window."""

Counted = frozenset[tuple[Metric, WindowName]]


def counted_windows(limits: QuotaLimits) -> Counted:
    """The (metric, window) pairs of the project's own windows ``limits`` counts."""
    if limits.unlimited:
        return frozenset()
    pairs: set[tuple[Metric, WindowName]] = {("requests", name) for name in WINDOWS}
    if limits.limits_tokens:
        pairs |= {("tokens", name) for name in WINDOWS}
    if limits.limits_cost:
        pairs |= {("cost", "day"), ("cost", "month")}
    return frozenset(pairs)


def newly_counted(before: QuotaLimits, after: QuotaLimits) -> Counted:
    return counted_windows(after) - counted_windows(before)


async def raise_to_used(
    store: StateStore,
    plan: Sequence[PlannedWindow],
    windows: Counted,
    used: Mapping[tuple[Metric, WindowName], int],
    now: float,
) -> None:
    """Raise each window of ``plan`` named in ``windows`` to at least what ``used``
    says its bucket used (a window already past it is left alone: never added to)."""
    for window in plan:
        pair = (window.metric, window.name)
        wanted = used.get(pair, 0)
        if pair not in windows or wanted <= 0:
            continue
        current = (await store.window_total(window.key)).total
        if wanted > current:
            await store.incr(window.key, wanted - current, ttl=window.ttl(now))
