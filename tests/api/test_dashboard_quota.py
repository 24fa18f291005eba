"""The admin dashboard's projects page with token and money ceilings: the edit form
has every limit, checks them all at once, warns beside a 0 and replaces the ceilings
as the API's PUT does; the row shows each counted window against its limit."""

from __future__ import annotations

import html
import re
import uuid

from app.domain.quotas.gate import CallEstimate, QuotaGate
from tests.api.test_dashboard_pages import Browser, Live, admin, dashboard_settings, live, member
from tests.support.helpers import PASSWORD, bearer, unique_email

__all__ = ["admin", "dashboard_settings", "live", "member"]

FORM = {
    "per_minute": "",
    "per_day": "",
    "per_month": "",
    "tokens_per_minute": "",
    "tokens_per_day": "",
    "tokens_per_month": "",
    "budget_per_day": "",
    "budget_per_month": "",
}


async def new_project(live: Live) -> str:
    email = unique_email("owner")
    await live.anonymous.post("/api/auth/register", json={"email": email, "password": PASSWORD})
    tokens = (
        await live.anonymous.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    ).json()
    created = await live.anonymous.post(
        "/api/projects",
        json={"name": "Budget project", "slug": f"b-{uuid.uuid4().hex[:8]}"},
        headers=bearer(tokens["accessToken"]),
    )
    assert created.status_code == 201, created.text
    project_id: str = created.json()["id"]
    return project_id


async def test_the_admin_sets_token_and_money_ceilings(live: Live, admin: Browser) -> None:
    project = await new_project(live)
    url = f"/admin/projects/{project}/quota"
    form = await admin.http.get(url, headers=admin.headers())
    for name in FORM:
        assert f'name="{name}"' in form.text
    assert "Budget in USD" in form.text

    bad = await admin.http.post(
        url,
        data={**FORM, "tokens_per_day": "lots", "budget_per_month": "-2", "per_day": "5"},
        headers=admin.headers(),
    )
    text = html.unescape(bad.text)
    assert f'id="quota-tokens-day-{project}-error"' in text
    assert f'id="quota-budget-month-{project}-error"' in text
    assert "Enter a whole number." in text
    assert "Enter an amount such as 25.50" in text
    assert 'value="5"' in text  # the valid field comes back as typed
    quota = (await live.api.get(f"/api/projects/{project}/quota")).json()
    assert set(quota["adminLimits"].values()) == {None}  # nothing saved

    saved = await admin.http.post(
        url,
        data={**FORM, "per_day": "100", "tokens_per_day": "50000", "budget_per_month": "19.99"},
        headers=admin.headers(),
    )
    assert saved.status_code == 200
    assert f'id="project-{project}"' in saved.text
    assert "19.99 USD" in saved.text
    assert "50,000" in saved.text
    quota = (await live.api.get(f"/api/projects/{project}/quota")).json()
    assert quota["adminLimits"]["tokensPerDay"] == 50000
    assert quota["adminLimits"]["budgetPerMonth"] == "19.99"
    assert quota["adminLimits"]["perDay"] == 100

    # The form opens with the ceilings in it; a 0 is warned about beside its field.
    again = await admin.http.get(url, headers=admin.headers())
    assert 'value="19.99"' in again.text
    zero = await admin.http.post(
        url, data={**FORM, "budget_per_day": "0.00", "tokens_per_day": "x"}, headers=admin.headers()
    )
    found = re.search(rf'id="quota-budget-day-{project}-warning"[^>]*>([^<]*)<', zero.text)
    assert found
    assert "0 blocks every priced call" in found.group(1)


async def test_the_row_shows_token_and_spend_windows(live: Live, admin: Browser) -> None:
    project = await new_project(live)
    response = await live.api.put(
        f"/api/admin/projects/{project}/quota",
        json={"tokensPerMinute": 400, "budgetPerDay": "3"},
    )
    assert response.status_code == 200, response.text
    gate: QuotaGate = live.resources.quota_gate

    async def estimate() -> CallEstimate:
        return CallEstimate(tokens=100, cost_micros=100_000)

    hold = await gate.reserve(uuid.UUID(project), None, estimate)
    assert hold is not None
    await hold.settle(40, 1_250_000)
    row = await admin.http.get(f"/admin/projects/{project}/row", headers=admin.headers())
    text = html.unescape(row.text)
    assert "style=" not in row.text
    assert re.search(r'<meter min="0" max="400"[^>]*value="40"', text)
    assert re.search(r'<meter min="0" max="3000000"[^>]*value="1250000"', text)
    assert "1.25 USD / 3 USD" in text
    assert "Tokens per minute" in text
    # The limits list the token and money ones that are set; the windows show what
    # the project counts (a budget per day counts the month's spend too).
    assert "<dt>Budget per day (UTC)</dt><dd>3 USD</dd>" in text
    assert "<dt>Budget per month (UTC)</dt><dd>1.25 USD" in text
    page = await admin.http.get("/admin/projects")
    assert page.status_code == 200
    assert "spend per UTC day and month" in page.text
