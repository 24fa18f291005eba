"""Token limits and money budgets in the quota API: admin ceilings, owners' lower
limits, validation naming the field (nothing written on a bad body), and what
``GET /quota`` shows of them. On PostgreSQL + Redis and on SQLite + memory.

Enforcement through real calls is in ``tests/gateway/test_quota_budgets.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.test_quotas import NO_LIMITS, admin_put, admin_url, get_quota, quota_url
from tests.support.api import Client
from tests.support.conversations import ADMIN, both_client, new_tenant
from tests.support.helpers import assert_error

__all__ = ["both_client"]

CEILINGS = {
    "perMinute": 60,
    "tokensPerMinute": 10_000,
    "tokensPerDay": 1_000_000,
    "tokensPerMonth": None,
    "budgetPerDay": "25.50",
    "budgetPerMonth": 500,
}


async def test_admin_ceilings_and_owner_limits_for_tokens_and_money(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    body = await admin_put(both_client, tenant.project_id, **CEILINGS)
    ceilings = {
        **NO_LIMITS,
        "perMinute": 60,
        "tokensPerMinute": 10_000,
        "tokensPerDay": 1_000_000,
        "budgetPerDay": "25.5",  # exact decimal text, trailing zeros dropped
        "budgetPerMonth": "500",
    }
    assert body["adminLimits"] == body["limits"] == ceilings
    assert body["ownerLimits"] == NO_LIMITS
    assert body["currency"] == "USD"

    # The owner lowers some; a JSON number is a budget too; equal to a ceiling is fine.
    response = await both_client.put(
        quota_url(tenant.project_id),
        json={
            "tokensPerMinute": 10_000,
            "tokensPerDay": 5_000,
            "tokensPerMonth": 90_000,
            "budgetPerDay": 12.25,
            "budgetPerMonth": "0.000001",
        },
        headers=tenant.owner,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ownerLimits"] == {
        **NO_LIMITS,
        "tokensPerMinute": 10_000,
        "tokensPerDay": 5_000,
        "tokensPerMonth": 90_000,
        "budgetPerDay": "12.25",
        "budgetPerMonth": "0.000001",
    }
    # Per field the lower of the two; no admin ceiling on the month: the owner's alone.
    assert body["limits"] == {
        **NO_LIMITS,
        "perMinute": 60,
        "tokensPerMinute": 10_000,
        "tokensPerDay": 5_000,
        "tokensPerMonth": 90_000,
        "budgetPerDay": "12.25",
        "budgetPerMonth": "0.000001",
    }
    assert body["adminLimits"] == ceilings

    # Every reader sees the same; the API key too.
    for headers in (tenant.owner, tenant.key, ADMIN):
        assert (await get_quota(both_client, tenant.project_id, headers))["limits"] == body[
            "limits"
        ]

    # The admin's PUT replaces every ceiling: absent ones are lifted, the owner's stay.
    body = await admin_put(both_client, tenant.project_id, tokensPerDay=1_000)
    assert body["adminLimits"] == {**NO_LIMITS, "tokensPerDay": 1_000}
    assert body["limits"]["tokensPerDay"] == 1_000  # the lower ceiling wins
    assert body["limits"]["budgetPerDay"] == "12.25"
    assert body["ownerLimits"]["tokensPerDay"] == 5_000

    # The owner's PUT replaces their limits as a whole too.
    response = await both_client.put(
        quota_url(tenant.project_id), json={"perDay": 3}, headers=tenant.owner
    )
    assert response.json()["ownerLimits"] == {**NO_LIMITS, "perDay": 3}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tokensPerMinute": 10_001}, "tokensPerMinute"),
        ({"tokensPerDay": 1_000_001}, "tokensPerDay"),
        ({"budgetPerDay": "25.500001"}, "budgetPerDay"),
        ({"budgetPerMonth": 500.5}, "budgetPerMonth"),
        # Several above: the first in field order is named.
        ({"budgetPerMonth": "501", "tokensPerMinute": 20_000}, "tokensPerMinute"),
    ],
)
async def test_an_owner_cannot_go_above_a_token_or_money_ceiling(
    both_client: Client, body: dict[str, Any], param: str
) -> None:
    tenant = await new_tenant(both_client)
    await admin_put(both_client, tenant.project_id, **CEILINGS)
    response = await both_client.put(quota_url(tenant.project_id), json=body, headers=tenant.owner)
    error = assert_error(response, 400, "above_admin_limit")
    assert error["param"] == param
    assert "platform admin" in error["message"]
    seen = await get_quota(both_client, tenant.project_id, tenant.owner)
    assert seen["ownerLimits"] == NO_LIMITS  # nothing written


BAD_VALUES = [
    ({"budgetPerDay": "1.1234567"}, "budgetPerDay", "invalid_limit"),
    ({"budgetPerDay": 1.1234567}, "budgetPerDay", "invalid_limit"),
    ({"budgetPerMonth": "-1"}, "budgetPerMonth", "invalid_limit"),
    ({"budgetPerMonth": -0.5}, "budgetPerMonth", "invalid_limit"),
    ({"budgetPerDay": "ten"}, "budgetPerDay", "invalid_limit"),
    ({"budgetPerDay": "1e3"}, "budgetPerDay", "invalid_limit"),
    ({"budgetPerDay": "1000000001"}, "budgetPerDay", "invalid_limit"),
    ({"budgetPerDay": True}, "budgetPerDay", "invalid_request"),
    ({"budgetPerDay": ["1"]}, "budgetPerDay", "invalid_request"),
    ({"tokensPerDay": -1}, "tokensPerDay", "invalid_request"),
    ({"tokensPerDay": "many"}, "tokensPerDay", "invalid_request"),
    ({"tokensPerMinute": 1.5}, "tokensPerMinute", "invalid_request"),
    ({"tokensPerMonth": 10**15 + 1}, "tokensPerMonth", "invalid_request"),
    ({"tokensPerHour": 5}, "tokensPerHour", "invalid_request"),
    # A valid field beside a bad one is not written either.
    ({"tokensPerDay": 5, "budgetPerMonth": "0.1234567"}, "budgetPerMonth", "invalid_limit"),
]


@pytest.mark.parametrize(("body", "param", "code"), BAD_VALUES)
async def test_bad_token_and_money_values_are_400_naming_the_field(
    both_client: Client, body: dict[str, Any], param: str, code: str
) -> None:
    tenant = await new_tenant(both_client)
    for url, headers in (
        (admin_url(tenant.project_id), ADMIN),
        (quota_url(tenant.project_id), tenant.owner),
    ):
        response = await both_client.put(url, json=body, headers=headers)
        error = assert_error(response, 400, code)
        assert error["param"] == param, error
        assert error["type"] == "invalid_request_error"
    # Neither side changed.
    seen = await get_quota(both_client, tenant.project_id, tenant.owner)
    assert seen["adminLimits"] == seen["ownerLimits"] == NO_LIMITS


async def test_the_largest_values_are_kept_exactly(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    body = await admin_put(
        both_client,
        tenant.project_id,
        tokensPerMonth=10**15,
        budgetPerMonth="1000000000",
        budgetPerDay="999999999.999999",
    )
    assert body["adminLimits"]["tokensPerMonth"] == 10**15
    assert body["adminLimits"]["budgetPerMonth"] == "1000000000"
    assert body["adminLimits"]["budgetPerDay"] == "999999999.999999"
    assert body["usage"]["tokens"]["month"]["limit"] == 10**15
    assert body["usage"]["spend"]["month"]["limit"] == "1000000000"


async def test_usage_shows_tokens_and_spend_windows_once_limited(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    body = await admin_put(both_client, tenant.project_id, tokensPerDay=100)
    usage = body["usage"]
    # Any token limit makes the project count all three token windows.
    assert usage["tokens"]["day"] == {**usage["tokens"]["day"], "used": 0, "limit": 100}
    assert usage["tokens"]["minute"] == {**usage["tokens"]["minute"], "used": 0, "limit": None}
    assert usage["tokens"]["month"]["used"] == 0
    # No budget: spend is not counted in the windows.
    assert usage["spend"]["day"] == {**usage["spend"]["day"], "used": None, "limit": None}
    for name in ("minute", "day", "month"):
        assert usage["tokens"][name]["resetsAt"] == usage[name]["resetsAt"]

    body = await admin_put(both_client, tenant.project_id, budgetPerMonth="7.5")
    spend = body["usage"]["spend"]
    assert spend["month"] == {**spend["month"], "used": "0", "limit": "7.5"}
    assert spend["day"] == {**spend["day"], "used": "0", "limit": None}
    assert spend["day"]["resetsAt"] == body["usage"]["day"]["resetsAt"]
    assert body["usage"]["tokens"]["day"]["used"] is None  # the token limit was replaced
