"""How the Keys tab shows a key's or token's spend against its budget, in plain
words (``"$3.20 of $10.00 this month"``) and as a ``<meter>`` (no inline style: the
strict CSP allows none, and a meter needs none to show a fill).

Amounts are shown to the cent; a spend below one cent is shown exactly, so a small
spend never reads as nothing. The budget has no currency of its own (it is in the
price book's): it takes the spend's currency, and is shown bare while nothing is
priced. The Projects API has the exact figures."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from types import MappingProxyType
from typing import Any

from app.domain.prices.amounts import text as exact_text
from app.domain.usage.key_spend import KeySpend, Spend, period_of

MICROS = 1_000_000
CENT = 10_000
"""One hundredth of a unit, in micro-units."""
SYMBOLS = MappingProxyType({"USD": "$", "EUR": "€", "GBP": "£"})
"""Currencies written with a sign; others by their code after the amount."""
WARN_AT = 0.75
ALARM_AT = 0.9
"""The meter turns amber, then red, at these shares of the budget (as on the quota tab)."""


def money(micros: int, currency: str | None) -> str:
    """``3_200_000, "USD"`` -> ``"$3.20"``; ``"12.00 CHF"``; bare without a currency."""
    if 0 < micros < CENT:
        figure = exact_text(micros)
    else:
        cents = (Decimal(micros) / MICROS).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        figure = f"{cents:,.2f}"
    if currency is None:
        return figure
    sign = SYMBOLS.get(currency)
    return f"{sign}{figure}" if sign else f"{figure} {currency}"


def _others(spend: Spend) -> str:
    """The spend in currencies other than the leading one (never added to it)."""
    lead = spend.currency
    return ", ".join(money(m, c) for c, m in sorted(spend.micros.items()) if c != lead)


def _counts(spend: Spend) -> str:
    calls = "1 request" if spend.requests == 1 else f"{spend.requests:,} requests"
    return f"{calls}, {spend.tokens:,} tokens"


def spend_view(spend: KeySpend, row: Any) -> dict[str, Any]:
    """What the tab shows of ``row``'s (an API key's or runtime token's) spend in its
    budget period: ``summary`` (one line), ``detail`` (counts, other currencies,
    today's spend), ``meter`` (``None`` without a budget), ``over`` (past it)."""
    period = period_of(row.budget_period)
    words = "today" if period == "day" else "this month"
    current = spend.of(period)
    budget: int | None = row.budget_micros
    spent, currency = current.amount_micros, current.currency
    if budget is not None:
        limit = money(budget, currency)
        summary = (
            f"{money(spent, currency)} of {limit} {words}"
            if currency is not None
            else f"Nothing spent {words} of a {limit} budget"
        )
    elif currency is not None:
        summary = f"{money(spent, currency)} {words}, no budget"
    elif current.requests:
        summary = f"No priced usage {words}, no budget"
    else:
        summary = f"No usage {words}"
    detail = [_counts(current)] if current.requests else []
    if others := _others(current):
        detail.append(f"also {others}")
    if period == "month" and spend.day.currency is not None:
        detail.append(f"today {money(spend.day.amount_micros, spend.day.currency)}")
    over = budget is not None and spent > budget
    meter = None
    if budget:
        share = round(spent * 100 / budget)
        meter = {
            "value": min(spent, budget),
            "max": budget,
            "low": int(budget * WARN_AT),
            "high": int(budget * ALARM_AT),
            "label": f"{share}% of the budget used {words}",
        }
    return {
        "summary": summary + (" (over budget)" if over else ""),
        "detail": "; ".join(detail),
        "meter": meter,
        "over": over,
    }
