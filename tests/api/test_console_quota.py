"""The console's Quotas tab with token limits and budgets: every field checked at
once with its message beside it (nothing saved on a bad form), a warning beside a
limit of 0, and each counted window's use against its limit as a ``<meter>``."""

from __future__ import annotations

import html
import re
import uuid

from app.domain.quotas.gate import CallEstimate, QuotaGate
from tests.api.test_console_pages import ADMIN_TOKEN, Site, Tenant, site, tenant
from tests.support.helpers import bearer

__all__ = ["site", "tenant"]

EMPTY = {
    "perMinute": "",
    "perDay": "",
    "perMonth": "",
    "tokensPerMinute": "",
    "tokensPerDay": "",
    "tokensPerMonth": "",
    "budgetPerDay": "",
    "budgetPerMonth": "",
}


async def owner_limits(tenant: Tenant) -> dict[str, object]:
    response = await tenant.owner.http.get(
        f"/api/projects/{tenant.project_id}/quota", headers=tenant.owner.api
    )
    assert response.status_code == 200, response.text
    limits: dict[str, object] = response.json()["ownerLimits"]
    return limits


async def set_ceilings(tenant: Tenant, **limits: object) -> None:
    response = await tenant.owner.http.put(
        f"/api/admin/projects/{tenant.project_id}/quota",
        json=limits,
        headers=bearer(ADMIN_TOKEN),
    )
    assert response.status_code == 200, response.text


def error_of(page: str, wire: str) -> str:
    found = re.search(rf'<p id="limit-{wire}-error" class="field-error">([^<]*)</p>', page)
    assert found, f"no error beside {wire}"
    return html.unescape(found.group(1))


async def test_the_tab_shows_token_and_budget_fields_and_checks_them_all_at_once(
    tenant: Tenant,
) -> None:
    b, owner = tenant.base, tenant.owner
    page = await owner.get(f"{b}/tabs/quota")
    assert page.status_code == 200
    for wire in EMPTY:
        assert f'name="{wire}"' in page.text
    assert 'inputmode="decimal"' in page.text  # budgets are amounts
    assert "Budgets are amounts in USD" in page.text

    await set_ceilings(tenant, tokensPerMinute=1000, budgetPerMonth="50")
    sent = {
        **EMPTY,
        "perMinute": "-3",
        "tokensPerMinute": "2000",
        "tokensPerDay": "many",
        "budgetPerDay": "1.1234567",
        "budgetPerMonth": "60",
        "perMonth": "70",
    }
    refused = await owner.post(f"{b}/quota", sent)
    assert refused.status_code == 422
    text = refused.text
    # Each problem beside its own field, in plain words.
    assert error_of(text, "perMinute").startswith("Enter a whole number of at least 0")
    assert error_of(text, "tokensPerDay").startswith("Enter a whole number.")
    assert error_of(text, "budgetPerDay").startswith("Enter an amount such as 25.50")
    assert "platform admin's limit of 1,000" in error_of(text, "tokensPerMinute")
    assert "platform admin's limit of 50 USD" in error_of(text, "budgetPerMonth")
    assert 'id="limit-perMonth-error"' not in text  # valid, and no ceiling
    assert 'aria-invalid="true"' in text
    # What was typed comes back; nothing was saved.
    assert 'value="1.1234567"' in text
    assert 'value="many"' in text
    assert set((await owner_limits(tenant)).values()) == {None}

    saved = await owner.post(
        f"{b}/quota",
        {**EMPTY, "tokensPerMinute": "1,000", "tokensPerDay": "20000", "budgetPerDay": "12.50"},
    )
    assert saved.status_code == 200, saved.text
    assert 'value="12.5"' in saved.text
    assert 'value="20000"' in saved.text
    limits = await owner_limits(tenant)
    assert limits["tokensPerMinute"] == 1000
    assert limits["tokensPerDay"] == 20000
    assert limits["budgetPerDay"] == "12.5"
    assert limits["budgetPerMonth"] is None

    # A member sees the limits but no form.
    member = await tenant.member.get(f"{b}/tabs/quota")
    assert "12.5 USD" in member.text
    assert 'name="budgetPerDay"' not in member.text


async def test_a_zero_limit_is_warned_about_beside_its_field(tenant: Tenant) -> None:
    b, owner = tenant.base, tenant.owner
    await set_ceilings(tenant, budgetPerMonth="0")
    saved = await owner.post(f"{b}/quota", {**EMPTY, "perDay": "0"})
    assert saved.status_code == 200, saved.text
    text = html.unescape(saved.text)
    warning = re.search(
        r'<p id="limit-perDay-warning" class="field-warning"[^>]*>([^<]*)</p>', text
    )
    assert warning, text
    assert "0 blocks every request" in warning.group(1)
    assert "you set it" in warning.group(1)
    assert 'aria-describedby="limit-perDay-warning"' in text
    month = re.search(r'id="limit-budgetPerMonth-warning"[^>]*>([^<]*)</p>', text)
    assert month
    assert "the platform admin set it" in month.group(1)
    assert "blocks every call" in text  # and in the table
    assert 'id="limit-perMonth-warning"' not in text


async def test_usage_per_window_is_shown_against_the_limit(site: Site, tenant: Tenant) -> None:
    b, owner = tenant.base, tenant.owner
    page = await owner.get(f"{b}/tabs/quota")
    assert "not counted" in page.text  # no token limit, no budget: not counted
    await set_ceilings(tenant, perDay=100, tokensPerDay=1000, budgetPerDay="2")
    # One call's worth in the windows, as admission and the meter leave it.
    gate: QuotaGate = site.resources.quota_gate

    async def estimate() -> CallEstimate:
        return CallEstimate(tokens=500, cost_micros=1_500_000)

    hold = await gate.reserve(uuid.UUID(tenant.project_id), None, estimate)
    assert hold is not None
    await hold.settle(250, 500_000)

    page = await owner.get(f"{b}/tabs/quota")
    text = html.unescape(page.text)
    assert "style=" not in page.text  # the CSP allows no inline styles
    assert re.search(r'<meter min="0" max="100"[^>]*value="1"', text)
    assert re.search(r'<meter min="0" max="1000"[^>]*value="250"', text)
    assert re.search(r'<meter min="0" max="2000000"[^>]*value="500000"', text)
    assert 'aria-label="Budget per day (UTC): 0.5 USD of 2 USD"' in text
    assert "Tokens per minute" in text
    quota = await owner.http.get(f"/api/projects/{tenant.project_id}/quota", headers=owner.api)
    usage = quota.json()["usage"]
    assert usage["tokens"]["day"]["used"] == 250
    assert usage["spend"]["day"]["used"] == "0.5"
