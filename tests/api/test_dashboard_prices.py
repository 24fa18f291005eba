"""The dashboard's price book page: admins see and add prices (the admin API's rules:
amounts checked, history kept), delete only future ones; others are kept out."""

from __future__ import annotations

import datetime
import uuid

from tests.api.test_dashboard_pages import (
    HTMX,
    Browser,
    Live,
    admin,
    dashboard_settings,
    live,
    member,
)

__all__ = ["admin", "dashboard_settings", "live", "member"]


async def test_an_admin_adds_a_price_and_deletes_a_future_one(live: Live, admin: Browser) -> None:
    page = await admin.http.get("/admin/prices")
    assert page.status_code == 200
    assert 'aria-current="page">Prices</a>' in page.text
    assert 'id="price-editor"' in page.text

    model = f"dash-price-{uuid.uuid4().hex[:8]}"
    refused = await admin.http.post(
        "/admin/prices",
        data={"model": model, "input": "-1", "output": "0.6", "currency": "USD"},
        headers=admin.headers(),
    )
    assert refused.status_code == 200
    assert "non-negative decimal amount" in refused.text
    assert 'value="-1"' in refused.text  # the form comes back as typed
    missing = await admin.http.post(
        "/admin/prices", data={"model": model, "currency": "USD"}, headers=admin.headers()
    )
    assert "Give the input price" in missing.text

    added = await admin.http.post(
        "/admin/prices",
        data={
            "model": model,
            "input": "0.15",
            "cached_input": "",
            "output": "0.6",
            "currency": "USD",
        },
        headers=admin.headers(),
    )
    assert "prices-changed" in added.headers.get("hx-trigger", ""), added.text
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    future = await admin.http.post(
        "/admin/prices",
        data={
            "model": model,
            "input": "0.1",
            "output": "0.4",
            "currency": "EUR",
            "effective_from": later.strftime("%Y-%m-%dT%H:%M"),
        },
        headers=admin.headers(),
    )
    assert "prices-changed" in future.headers.get("hx-trigger", ""), future.text

    listed = await live.api.get("/api/admin/prices", params={"limit": 500})
    ours = {p["currency"]: p for p in listed.json()["items"] if p["model"] == model}
    assert ours["USD"]["input"] == "0.15"
    assert ours["USD"]["cachedInput"] is None
    assert ours["USD"]["inForce"] is True
    assert ours["EUR"]["inForce"] is False
    rows = await admin.http.get("/admin/price-rows", headers=HTMX)
    assert f"<code>{model}</code>" in rows.text
    assert f'id="delete-price-{ours["EUR"]["id"]}"' in rows.text
    assert f'id="delete-price-{ours["USD"]["id"]}"' not in rows.text  # history

    deleted = await admin.http.delete(f"/admin/prices/{ours['EUR']['id']}", headers=admin.headers())
    assert deleted.status_code == 200
    assert "toast" in deleted.headers["hx-trigger"]
    in_force = await admin.http.delete(
        f"/admin/prices/{ours['USD']['id']}", headers=admin.headers()
    )
    assert in_force.status_code == 409
    left = await live.api.get("/api/admin/prices", params={"limit": 500})
    assert [p["currency"] for p in left.json()["items"] if p["model"] == model] == ["USD"]


async def test_the_price_page_is_for_platform_admins_only(live: Live, member: Browser) -> None:
    assert (await live.anonymous.get("/admin/prices")).status_code in (302, 303)
    assert (await member.http.get("/admin/prices")).status_code == 403
    refused = await member.http.post(
        "/admin/prices",
        data={"model": "m", "input": "1", "output": "1"},
        headers=member.headers(),
    )
    assert refused.status_code == 403
