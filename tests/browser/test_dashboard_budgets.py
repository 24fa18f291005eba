"""The budgets page in a real browser: alerts published on the app's EventBus (as
``BudgetAlerts`` publishes them on whichever replica raised them) appear on the open
page over SSE, newest first, a warning and a reached limit told apart, and without a
reload or a CSP violation.

``site`` comes before ``page`` in every signature: the browser closes first.
"""

from __future__ import annotations

import datetime
import uuid

from playwright.async_api import ConsoleMessage, Page, expect

from app.domain.quotas.alerts import CHANNEL, BudgetAlert
from app.lib.clock import utcnow
from tests.support.browser import Site, log_in_as_admin
from tests.support.helpers import PASSWORD, bearer, unique_email


async def _project(site: Site, name: str) -> uuid.UUID:
    email = unique_email("budget-owner")
    await site.http.post("/api/auth/register", json={"email": email, "password": PASSWORD})
    login = await site.http.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    created = await site.http.post(
        "/api/projects",
        json={"name": name, "slug": f"b-{uuid.uuid4().hex[:10]}"},
        headers=bearer(login.json()["accessToken"]),
    )
    assert created.status_code == 201, created.text
    return uuid.UUID(created.json()["id"])


def _alert(project_id: uuid.UUID, threshold: int, metric: str = "cost") -> BudgetAlert:
    now = utcnow()
    return BudgetAlert(
        alert_id=f"{{{project_id}}}:{metric}:{threshold}:{uuid.uuid4().hex[:6]}",
        project_id=project_id,
        credential_id=None,
        metric=metric,  # type: ignore[arg-type]
        window="day",
        threshold=threshold,
        used=threshold * 100_000 if metric == "cost" else threshold * 1_000,
        limit=10_000_000 if metric == "cost" else 100_000,
        currency="USD" if metric == "cost" else None,
        resets_at=now + datetime.timedelta(hours=3),
        at=now,
    )


async def test_alerts_appear_live_on_the_budgets_page(site: Site, page: Page) -> None:
    name = f"Browser Budget {uuid.uuid4().hex[:4]}"
    project_id = await _project(site, name)
    errors: list[str] = []

    def seen(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", seen)
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin")
    sections = page.get_by_role("navigation", name="Dashboard sections")
    await sections.get_by_role("link", name="Budgets").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Budget alerts")
    rows = page.locator("#budget-alerts")
    await expect(rows).to_contain_text("No budget alert yet")
    await expect(page.locator(".live-dot")).to_have_count(1)
    # A marker a reload would wipe: everything below arrives over SSE.
    await page.evaluate("window.aronaTestMarker = 'same page'")

    bus = site.resources.event_bus
    await bus.publish(CHANNEL, _alert(project_id, 80).event("replica-b"))
    first = rows.locator("tr.budget-alert")
    await expect(first).to_have_count(1, timeout=15_000)
    await expect(first).to_contain_text(name)
    await expect(first).to_contain_text("spend per day")
    await expect(first).to_contain_text("8 USD / 10 USD")
    await expect(first.locator(".badge")).to_have_text("80 % · warning")

    await bus.publish(CHANNEL, _alert(project_id, 100, "tokens").event("replica-c"))
    await expect(rows.locator("tr.budget-alert")).to_have_count(2)
    newest = rows.locator("tr.budget-alert").first
    await expect(newest.locator(".badge")).to_have_text("100 % · reached")
    await expect(newest).to_contain_text("100,000 / 100,000")
    await expect(newest).to_have_class("budget-alert bad")
    await expect(rows.locator("tr.budget-alert").nth(1)).to_have_class("budget-alert warn")

    assert await page.evaluate("window.aronaTestMarker") == "same page"

    # The project's name leads to its own alerts.
    await newest.get_by_role("link", name=name).click()
    await expect(page.get_by_role("heading", name=f"Alerts of {name}")).to_be_visible()
    await expect(page.locator("#budget-alerts tr.budget-alert")).to_have_count(2)
    assert not [e for e in errors if "Content Security Policy" in e], errors
