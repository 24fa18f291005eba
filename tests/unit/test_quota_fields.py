"""The quota's limit fields without a server: every field maps to real columns, form
text and JSON values read alike, every problem is reported at once."""

from __future__ import annotations

import dataclasses

import pytest

from app.db.models import ProjectQuota
from app.domain.quotas.fields import (
    FIELDS,
    MAX_TOKENS,
    LimitErrors,
    QuotaValues,
    above_ceilings,
    read_limits,
    valid_limits,
)
from app.domain.quotas.limits import QuotaLimits


def test_every_field_has_its_columns_and_limit() -> None:
    columns = set(ProjectQuota.__table__.columns.keys())
    for field in FIELDS:
        assert field.column in columns
        assert field.owner in columns
        assert hasattr(QuotaLimits(), field.effective)
    assert {f.name for f in dataclasses.fields(QuotaValues)} == {f.column for f in FIELDS}
    assert len({f.wire for f in FIELDS}) == len(FIELDS) == 8


def test_form_text_and_json_values_read_alike() -> None:
    from_form, problems = read_limits(
        {"perDay": " 1,000 ", "tokensPerMonth": "5_000", "budgetPerDay": "2.50", "perMonth": ""}
    )
    assert problems == {}
    from_json = valid_limits({"perDay": 1000, "tokensPerMonth": 5000, "budgetPerDay": 2.5})
    assert from_form == from_json
    assert from_json.per_day == 1000
    assert from_json.budget_per_day_micros == 2_500_000
    assert from_json.per_month is None


def test_every_problem_is_reported_in_field_order() -> None:
    values, problems = read_limits(
        {
            "budgetPerMonth": "1.0000001",
            "perMinute": "-1",
            "tokensPerDay": MAX_TOKENS + 1,
            "perDay": True,
            "budgetPerDay": "abc",
            "tokensPerMinute": "7",
        }
    )
    assert list(problems) == [
        "perMinute",
        "perDay",
        "tokensPerDay",
        "budgetPerDay",
        "budgetPerMonth",
    ]
    assert values.tokens_per_minute == 7
    assert values.per_minute is None
    for wire, problem in problems.items():
        assert problem.code == "invalid_limit"
        assert f"`{wire}`" in problem.message  # the API's names the field
        assert "`" not in problem.plain  # the page's is plain words
    with pytest.raises(LimitErrors) as refused:
        valid_limits({"budgetPerMonth": "-1", "perDay": "x"})
    assert refused.value.param == "perDay"
    assert set(refused.value.fields) == {"perDay", "budgetPerMonth"}
    assert refused.value.status_code == 400


def test_an_owner_limit_above_a_ceiling_is_named() -> None:
    ceilings = QuotaValues(per_day=10, tokens_per_day=100, budget_per_month_micros=5_000_000)
    wanted = QuotaValues(
        per_day=10, per_month=99, tokens_per_day=101, budget_per_month_micros=5_000_001
    )
    problems = above_ceilings(ceilings, wanted)
    assert list(problems) == ["tokensPerDay", "budgetPerMonth"]
    assert problems["budgetPerMonth"].code == "above_admin_limit"
    assert "(5.000001)" in problems["budgetPerMonth"].message
    assert "(5)" in problems["budgetPerMonth"].message
    assert "5 USD" in problems["budgetPerMonth"].plain
    assert "100" in problems["tokensPerDay"].plain
