"""The Keys tab's words for a key's spend: amounts to the cent (below a cent exactly),
the budget beside them, plain language without a budget or without priced usage."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.domain.console.key_spend_view import money, spend_view
from app.domain.usage.key_spend import NO_SPEND, KeySpend, Spend


@dataclass
class Row:
    budget_micros: int | None = None
    budget_period: str | None = None


@pytest.mark.parametrize(
    ("micros", "currency", "shown"),
    [
        (3_200_000, "USD", "$3.20"),
        (0, "EUR", "€0.00"),
        (150, "USD", "$0.00015"),  # below a cent: exact, never "$0.00"
        (1_234_567_890, "GBP", "£1,234.57"),
        (12_005_000, "CHF", "12.01 CHF"),
        (10_000_000, None, "10.00"),
    ],
)
def test_money(micros: int, currency: str | None, shown: str) -> None:
    assert money(micros, currency) == shown


def test_spend_against_a_monthly_budget_with_other_currencies_and_today() -> None:
    month = Spend({"USD": 3_200_000, "EUR": 500_000}, tokens=4200, requests=12)
    day = Spend({"USD": 400_000}, tokens=10, requests=1)
    view = spend_view(KeySpend(month=month, day=day), Row(10_000_000, "month"))
    assert view["summary"] == "$3.20 of $10.00 this month"
    assert view["detail"] == "12 requests, 4,200 tokens; also €0.50; today $0.40"
    assert view["meter"] == {
        "value": 3_200_000,
        "max": 10_000_000,
        "low": 7_500_000,
        "high": 9_000_000,
        "label": "32% of the budget used this month",
    }
    assert view["over"] is False


def test_plain_words_without_a_budget_or_priced_usage() -> None:
    assert spend_view(NO_SPEND, Row())["summary"] == "No usage this month"
    assert spend_view(NO_SPEND, Row())["meter"] is None
    unpriced = KeySpend(month=Spend({}, tokens=5, requests=1))
    view = spend_view(unpriced, Row())
    assert (view["summary"], view["detail"]) == (
        "No priced usage this month, no budget",
        "1 request, 5 tokens",
    )
    priced = KeySpend(month=Spend({"USD": 20_000}, tokens=5, requests=1))
    assert spend_view(priced, Row())["summary"] == "$0.02 this month, no budget"
    budget_only = spend_view(NO_SPEND, Row(2_000_000, "day"))
    assert budget_only["summary"] == "Nothing spent today of a 2.00 budget"
    assert budget_only["meter"] is not None
    assert budget_only["meter"]["value"] == 0


def test_a_spend_past_its_budget_is_said_and_the_meter_is_full() -> None:
    day = Spend({"USD": 2_500_000}, tokens=1, requests=1)
    view = spend_view(KeySpend(month=day, day=day), Row(2_000_000, "day"))
    assert view["summary"] == "$2.50 of $2.00 today (over budget)"
    assert view["over"] is True
    assert view["meter"]["value"] == 2_000_000
    assert view["meter"]["label"] == "125% of the budget used today"
    # A zero budget has no meter (its range would be empty), only the words.
    zero = spend_view(KeySpend(month=day, day=day), Row(0, "month"))
    assert (zero["summary"], zero["meter"]) == ("$2.50 of $0.00 this month (over budget)", None)
