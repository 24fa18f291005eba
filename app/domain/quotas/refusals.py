"""What a refused call is told: which limit, whose, and when a retry can succeed."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

from app.domain.quotas.errors import Metric, QuotaExceededError
from app.domain.quotas.windows import WINDOWS, PlannedWindow

_RANK: dict[Metric, int] = {"requests": 0, "tokens": 1, "cost": 2}


def refusing_window(full: Sequence[tuple[PlannedWindow, int, int]]) -> tuple[PlannedWindow, int]:
    """Of the full windows (window, its count, the call's amount in it), the one a
    refusal names, with the call's amount: the latest reset (when a retry can
    succeed); on a tie the longer window, then money before tokens before requests."""
    window, _, amount = max(
        full, key=lambda f: (f[0].resets_at, WINDOWS.index(f[0].name), _RANK[f[0].metric])
    )
    return window, amount


def quota_exceeded(window: PlannedWindow, amount: int, now: float) -> QuotaExceededError:
    """The 429 of a call ``window`` has no room for, ``Retry-After`` to its end."""
    assert window.limit is not None  # only limited windows can be full
    retry_after = window.resets_at - now
    return QuotaExceededError(
        refusal_message(window, amount, retry_after),
        window=window.name,
        limit=window.limit,
        retry_after=retry_after,
        metric=window.metric,
    )


def refusal_message(window: PlannedWindow, amount: int, retry_after: float) -> str:
    whose = "this project" if window.credential_id is None else "this credential"
    limit = window.limit or 0
    if window.metric == "cost":
        what = f"budget of {money(limit)} per {window.name}"
    elif window.metric == "tokens":
        what = f"limit of {limit} tokens per {window.name}"
    else:
        what = f"limit of {limit} requests per {window.name}"
    if amount > limit and window.metric != "requests":
        asked = money(amount) if window.metric == "cost" else f"{amount} tokens"
        return (
            f"this call may use up to {asked}, more than {whose}'s whole {what}; "
            "lower max_tokens or raise the limit"
        )
    if window.metric == "requests" and window.name == "minute":
        return (
            f"{whose} is limited to {limit} requests per minute; "
            f"retry in {math.ceil(retry_after)} s"
        )
    resets = (
        datetime.datetime.fromtimestamp(window.resets_at, datetime.UTC)
        .isoformat()
        .replace("+00:00", "Z")
    )
    if window.metric == "requests":
        return (
            f"{whose}'s quota of {limit} requests per {window.name} is used up; "
            f"it resets at {resets}"
        )
    if window.name == "minute":
        return f"{whose}'s {what} is used up; retry in {math.ceil(retry_after)} s"
    return f"{whose}'s {what} is used up; it resets at {resets}"


def money(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else f"{whole}"
