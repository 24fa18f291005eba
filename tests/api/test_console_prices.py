"""The console's own-prices section (Quotas and usage tab): an owner prices the
project's custom LLM and override-key calls; mistakes come back next to their field;
members read."""

from __future__ import annotations

from tests.api.test_console_pages import Site, Tenant, site, tenant

__all__ = ["site", "tenant"]


async def test_an_owner_adds_a_price_of_the_projects_own_and_members_read_it(
    site: Site, tenant: Tenant
) -> None:
    b = tenant.base
    page = await tenant.owner.get(f"{b}/tabs/quota")
    assert "No prices of your own" in page.text
    assert f'hx-post="{b}/prices"' in page.text

    refused = await tenant.owner.post(
        f"{b}/prices", {"model": "custom:bob", "input": "-1", "output": "2", "currency": "EUR"}
    )
    assert refused.status_code == 422
    assert 'id="price-input-error"' in refused.text
    assert 'value="custom:bob"' in refused.text  # the form comes back as typed
    bad_currency = await tenant.owner.post(
        f"{b}/prices", {"model": "custom:bob", "input": "1", "output": "2", "currency": "euro"}
    )
    assert bad_currency.status_code == 422
    assert 'id="price-currency-error"' in bad_currency.text

    added = await tenant.owner.post(
        f"{b}/prices",
        {"model": "custom:bob", "input": "3", "cachedInput": "", "output": "15", "currency": "EUR"},
    )
    assert added.status_code == 200, added.text
    assert "Price of custom:bob added." in added.headers.get("hx-trigger", "")
    assert "<code>custom:bob</code>" in added.text
    assert "3 EUR" in added.text
    assert "15 EUR" in added.text
    stored = await tenant.owner.http.get(
        f"/api/projects/{tenant.project_id}/prices", headers=tenant.owner.api
    )
    [price] = stored.json()["items"]
    assert (price["model"], price["input"], price["cachedInput"], price["currency"]) == (
        "custom:bob",
        "3",
        None,
        "EUR",
    )

    seen = await tenant.member.get(f"{b}/tabs/quota")
    assert "<code>custom:bob</code>" in seen.text
    assert f'hx-post="{b}/prices"' not in seen.text
    assert "only the project's owners and platform admins can set its prices" in seen.text
    assert (await tenant.stranger.get(f"{b}/tabs/quota")).status_code == 404
