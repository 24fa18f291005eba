"""The limits a project quota has, as the API, the console and the dashboard read them.

Eight limits, each an admin ceiling and an owner's own lower limit (``None``: no
limit): requests per minute, day and month; tokens per minute, day and month; and a
money budget per day and month, kept in micro-units of the price book's currency and
written as decimal text (``"25.50"``; JSON numbers too, like a key's budget).

``read_limits`` turns what was sent (JSON values or form text, by wire name) into
``QuotaValues`` and every field's problem at once; ``above_ceilings`` says which of
an owner's limits exceed the admin's. Each problem has a message for the API (naming
the field) and one in plain words for the pages, shown beside the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from app.domain.accounts.governance import MAX_BUDGET_MICROS, MICROS, budget_text, parse_budget
from app.domain.quotas.errors import WindowName
from app.lib.errors import BadRequestError

Kind = Literal["requests", "tokens", "money"]

DEFAULT_CURRENCY = "USD"
"""The price book's default currency: what budgets are counted in."""
MAX_REQUESTS = 2_147_483_647
"""The request columns are 32-bit integers."""
MAX_TOKENS = 10**15
"""The token columns are BIGINTs; the bound also stays below 2**53, so the counters
(Lua numbers in Redis are doubles) remain exact however close a window gets to it."""


@dataclass(frozen=True, slots=True)
class QuotaField:
    wire: str
    """The field's name in JSON bodies and forms (``tokensPerDay``)."""
    column: str
    """The admin ceiling's column, and the ``QuotaValues`` attribute."""
    owner: str
    """The owner's column."""
    effective: str
    """The ``QuotaLimits`` attribute (the lower of the two)."""
    kind: Kind
    window: WindowName
    label: str

    @property
    def maximum(self) -> int:
        if self.kind == "money":
            return MAX_BUDGET_MICROS
        return MAX_TOKENS if self.kind == "tokens" else MAX_REQUESTS

    def text(self, value: int | None) -> str | None:
        """``value`` as the API writes it: money as exact decimal text."""
        if value is None:
            return None
        return budget_text(value) if self.kind == "money" else str(value)

    def shown(self, value: int) -> str:
        """``value`` for a message: thousands separated, money as decimal text."""
        return f"{budget_text(value)} {DEFAULT_CURRENCY}" if self.kind == "money" else f"{value:,}"


def _field(wire: str, column: str, kind: Kind, window: WindowName, label: str) -> QuotaField:
    effective = column.removesuffix("_micros")
    return QuotaField(wire, column, f"owner_{column}", effective, kind, window, label)


FIELDS: tuple[QuotaField, ...] = (
    _field("perMinute", "per_minute", "requests", "minute", "Requests per minute"),
    _field("perDay", "per_day", "requests", "day", "Requests per day (UTC)"),
    _field("perMonth", "per_month", "requests", "month", "Requests per month (UTC)"),
    _field("tokensPerMinute", "tokens_per_minute", "tokens", "minute", "Tokens per minute"),
    _field("tokensPerDay", "tokens_per_day", "tokens", "day", "Tokens per day (UTC)"),
    _field("tokensPerMonth", "tokens_per_month", "tokens", "month", "Tokens per month (UTC)"),
    _field("budgetPerDay", "budget_per_day_micros", "money", "day", "Budget per day (UTC)"),
    _field("budgetPerMonth", "budget_per_month_micros", "money", "month", "Budget per month (UTC)"),
)
WIRE_NAMES: tuple[str, ...] = tuple(f.wire for f in FIELDS)


@dataclass(frozen=True, slots=True)
class QuotaValues:
    """One side of a quota (the admin's ceilings or the owner's limits), by the admin
    column's name; money in micro-units."""

    per_minute: int | None = None
    per_day: int | None = None
    per_month: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    budget_per_day_micros: int | None = None
    budget_per_month_micros: int | None = None

    def get(self, column: str) -> int | None:
        value: int | None = getattr(self, column)
        return value

    def of(self, field: QuotaField) -> int | None:
        return self.get(field.column)

    @classmethod
    def of_row(cls, row: object | None, *, owner: bool) -> QuotaValues:
        """The ceilings (or, with ``owner``, the owner's limits) of a ``ProjectQuota``
        row; no row: no limits."""
        if row is None:
            return cls()
        return cls(**{f.column: getattr(row, f.owner if owner else f.column) for f in FIELDS})

    def columns(self, *, owner: bool) -> dict[str, int | None]:
        """The values by the row's column names (the owner's or the admin's)."""
        return {f.owner if owner else f.column: self.of(f) for f in FIELDS}


@dataclass(frozen=True, slots=True)
class LimitProblem:
    code: str
    message: str
    """For the API: names the field."""
    plain: str
    """For the pages, shown beside the field."""


class LimitErrors(BadRequestError):
    """400 for the first invalid field (``param`` names it); ``fields`` holds all, by
    wire name, in the order of ``FIELDS``."""

    def __init__(self, problems: Mapping[str, LimitProblem]) -> None:
        ordered = {wire: problems[wire] for wire in WIRE_NAMES if wire in problems}
        param, first = next(iter(ordered.items()))
        super().__init__(first.message, code=first.code, param=param)
        self.fields = ordered


def _whole(field: QuotaField, raw: object) -> tuple[int | None, LimitProblem | None]:
    wire = field.wire
    if isinstance(raw, str):
        # Forms: "10,000" and "10 000" as the pages print numbers.
        text = raw.replace(",", "").replace("_", "").replace(" ", "")
        try:
            raw = int(text)
        except ValueError:
            return None, LimitProblem(
                "invalid_limit",
                f"`{wire}` must be a whole number of zero or more",
                "Enter a whole number. Leave it empty for no limit.",
            )
    if not isinstance(raw, int) or isinstance(raw, bool):
        return None, LimitProblem(
            "invalid_limit",
            f"`{wire}` must be a whole number of zero or more",
            "Enter a whole number. Leave it empty for no limit.",
        )
    if raw < 0:
        return None, LimitProblem(
            "invalid_limit",
            f"`{wire}` must be zero or more, got {raw}",
            "Enter a whole number of at least 0. Leave it empty for no limit.",
        )
    if raw > field.maximum:
        return None, LimitProblem(
            "invalid_limit",
            f"`{wire}` must be at most {field.maximum}, got {raw}",
            f"Enter a whole number no larger than {field.maximum:,}.",
        )
    return raw, None


def _money(field: QuotaField, raw: object) -> tuple[int | None, LimitProblem | None]:
    micros = parse_budget(raw) if isinstance(raw, str | int | float) else None
    if micros is not None:
        return micros, None
    most = MAX_BUDGET_MICROS // MICROS
    return None, LimitProblem(
        "invalid_limit",
        f"`{field.wire}` must be a decimal amount of zero or more with at most 6 decimals "
        f'and at most {most}, such as "25.50"',
        f"Enter an amount such as 25.50: zero or more, at most 6 decimals, at most {most:,}. "
        "Leave it empty for no budget.",
    )


def read_limits(raw: Mapping[str, object]) -> tuple[QuotaValues, dict[str, LimitProblem]]:
    """``raw`` by wire name (absent, ``None`` or empty text: no limit) as values, and
    every field's problem (a field in error is ``None`` in the values)."""
    values: dict[str, int | None] = {}
    problems: dict[str, LimitProblem] = {}
    for field in FIELDS:
        value = raw.get(field.wire)
        if isinstance(value, str):
            value = value.strip()
        if value is None or value == "":
            values[field.column] = None
            continue
        read = _money if field.kind == "money" else _whole
        number, problem = read(field, value)
        values[field.column] = number
        if problem is not None:
            problems[field.wire] = problem
    return QuotaValues(**values), problems


def valid_limits(raw: Mapping[str, object]) -> QuotaValues:
    """``read_limits`` for the API: the values, or a 400 naming the first bad field."""
    values, problems = read_limits(raw)
    if problems:
        raise LimitErrors(problems)
    return values


def above_ceilings(ceilings: QuotaValues, wanted: QuotaValues) -> dict[str, LimitProblem]:
    """The owner's limits above the admin's ceilings: an owner may only lower them."""
    problems: dict[str, LimitProblem] = {}
    for field in FIELDS:
        ceiling, value = ceilings.of(field), wanted.of(field)
        if ceiling is None or value is None or value <= ceiling:
            continue
        problems[field.wire] = LimitProblem(
            "above_admin_limit",
            f"`{field.wire}` ({field.text(value)}) is above the limit the platform admin set "
            f"({field.text(ceiling)}); an owner may only lower it",
            f"This is above the platform admin's limit of {field.shown(ceiling)}: "
            "you may only lower it.",
        )
    return problems
