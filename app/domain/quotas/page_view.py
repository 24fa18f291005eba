"""What the pages show of a project's limits (the console's Quotas tab, the admin
dashboard's projects page): per window what it used against the limit in force
(requests, tokens, spend), both sides of each limit, and a form's current values.

Plain values only (templates must not touch stored rows), shaped from the same
``QuotaOut`` the API answers, so the pages and ``GET /quota`` never disagree.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from app.domain.accounts.governance import MICROS, budget_text
from app.domain.quotas.fields import FIELDS, QuotaField
from app.domain.quotas.schemas import LimitsOut, MoneyUsageOut, QuotaOut, WindowUsageOut

SECTIONS = (
    ("requests", "Requests"),
    ("tokens", "Tokens (prompt + completion)"),
    ("money", "Spend"),
)


@dataclass(frozen=True, slots=True)
class LimitView:
    """One limit of the tab: a row of the usage table and a field of the form."""

    wire: str
    name: str
    """The snake_case name (``tokens_per_day``) the dashboard's forms use."""
    label: str
    kind: str
    window: str
    used: int | None
    """In units (money: micro-units), for the meter; ``None``: not known."""
    used_text: str
    limit: int | None
    """The limit in force, in units (money: micro-units)."""
    limit_text: str
    admin: int | None
    owner: int | None
    admin_text: str
    owner_text: str
    resets_at: datetime.datetime
    counted: bool
    """Whether the project counts this window (tokens and spend only while a token
    limit or a budget is set)."""
    blocked_by: str | None
    """Who set the limit of 0 that refuses every call: ``"you"``, ``"the platform
    admin"`` or ``None``."""

    @property
    def meter_low(self) -> int:
        return (self.limit or 0) * 3 // 4

    @property
    def meter_high(self) -> int:
        return (self.limit or 0) * 9 // 10

    @property
    def slug(self) -> str:
        """For element ids: ``minute`` (requests), ``tokens-day``, ``budget-month``."""
        prefix = {"requests": "", "tokens": "tokens-", "money": "budget-"}[self.kind]
        return prefix + self.window

    @property
    def inputmode(self) -> str:
        return "decimal" if self.kind == "money" else "numeric"

    @property
    def zero_note(self) -> str:
        """What a limit of 0 does here (a budget of 0 lets unpriced calls through:
        they cost nothing)."""
        what = {"requests": "request", "tokens": "call", "money": "priced call"}[self.kind]
        return f"0 blocks every {what} of this project in this window."

    @property
    def zero_warning(self) -> str:
        """The warning beside the field while a 0 is in force ("" otherwise)."""
        if self.blocked_by is None:
            return ""
        return (
            f"{self.zero_note[:-1]}: {self.blocked_by} set it. Leave the field empty for no limit."
        )


def _micros(text: str) -> int:
    """``budget_text``'s decimal text back to micro-units (exact)."""
    whole, _, fraction = text.partition(".")
    return int(whole) * MICROS + int((fraction + "000000")[:6])


def _value(limits: LimitsOut, field: QuotaField) -> int | None:
    """A limit in units (money back to micro-units from its decimal text)."""
    raw: int | str | None = getattr(limits, field.effective)
    return _micros(raw) if isinstance(raw, str) else raw


def _text(field: QuotaField, value: int | None, currency: str, none: str = "none") -> str:
    if value is None:
        return none
    if field.kind == "money":
        return f"{budget_text(value)} {currency}"
    return f"{value:,}"


def _usage(quota: QuotaOut, field: QuotaField) -> WindowUsageOut | MoneyUsageOut:
    usage = quota.usage
    if field.kind == "requests":
        found: WindowUsageOut | MoneyUsageOut = getattr(usage, field.window)
    elif field.kind == "tokens":
        found = getattr(usage.tokens, field.window)
    else:
        found = getattr(usage.spend, field.window)
    return found


def _counts(quota: QuotaOut, kind: str) -> bool:
    if kind == "requests":
        return True
    fields = [f for f in FIELDS if f.kind == kind]
    return any(_value(quota.limits, f) is not None for f in fields)


def limit_views(quota: QuotaOut) -> list[LimitView]:
    views = []
    for field in FIELDS:
        usage = _usage(quota, field)
        used: int | None
        if isinstance(usage, MoneyUsageOut):
            used = None if usage.used is None else _micros(usage.used)
        else:
            used = usage.used
        limit = _value(quota.limits, field)
        admin, owner = _value(quota.admin_limits, field), _value(quota.owner_limits, field)
        blocked_by = None
        if limit == 0:
            blocked_by = "the platform admin" if admin == 0 else "you"
        views.append(
            LimitView(
                wire=field.wire,
                name=field.effective,
                label=field.label,
                kind=field.kind,
                window=field.window,
                used=used,
                used_text=_text(field, used, quota.currency, ""),
                limit=limit,
                limit_text=_text(field, limit, quota.currency),
                admin=admin,
                owner=owner,
                admin_text=_text(field, admin, quota.currency),
                owner_text=_text(field, owner, quota.currency),
                resets_at=usage.resets_at,
                counted=_counts(quota, field.kind),
                blocked_by=blocked_by,
            )
        )
    return views


def form_values(limits: LimitsOut) -> dict[str, str]:
    """One side of the limits as a form shows them, by wire name (empty: no limit)."""
    values = {}
    for field in FIELDS:
        value: int | str | None = getattr(limits, field.effective)
        values[field.wire] = "" if value is None else str(value)
    return values


def sections(views: list[LimitView]) -> list[dict[str, Any]]:
    """The limits grouped for the table and the form: requests, tokens, spend."""
    return [
        {"kind": kind, "title": title, "limits": [v for v in views if v.kind == kind]}
        for kind, title in SECTIONS
    ]
