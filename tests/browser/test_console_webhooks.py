"""The Webhooks tab in a real browser: add a webhook (its signing secret shown once),
send a test event to a real HTTPS receiver and see it in the delivery log, with no
CSP violation on the way."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from playwright.async_api import ConsoleMessage, Page, expect

from app.lib.settings import Settings
from tests.support.auth import fresh_database
from tests.support.browser import Site, log_in_as_admin
from tests.support.settings import with_settings
from tests.support.webhooks import Tls, WebhookReceiver, make_tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
async def browser_settings(
    tmp_path_factory: pytest.TempPathFactory, tls: Tls
) -> AsyncIterator[Settings]:
    """The browser suite's settings, with the test receiver allowed and trusted."""
    async with fresh_database("postgres", tmp_path_factory.mktemp("browser-hooks")) as settings:
        yield with_settings(
            settings,
            registration_open=True,
            webhook_allow_private=True,
            webhook_ca_file=tls.ca_file,
        )


@pytest.fixture
async def receiver(tls: Tls) -> AsyncIterator[WebhookReceiver]:
    receiver = WebhookReceiver(tls)
    await receiver.start()
    yield receiver
    await receiver.stop()


async def test_a_webhook_is_added_and_its_test_delivery_is_logged(
    page: Page, site: Site, receiver: WebhookReceiver
) -> None:
    errors: list[str] = []

    def seen(msg: ConsoleMessage) -> None:
        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico"):
            errors.append(msg.text)

    page.on("console", seen)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await log_in_as_admin(page, site)
    await page.get_by_label("Name", exact=True).fill("Hooks project")
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Hooks project")

    await page.get_by_role("tab", name="Webhooks").click()
    panel = page.locator("#tab-panel")
    await expect(panel.get_by_role("heading", name="Add a webhook")).to_be_visible()
    await panel.get_by_label("URL", exact=True).fill(receiver.url())
    await panel.get_by_label("Description (optional)").fill("on-call pager")
    await panel.get_by_role("button", name="Add webhook").click()
    await expect(page.locator(".toast").last).to_contain_text("shown only once")
    secret = await panel.locator("#new-secret-value").inner_text()
    assert re.fullmatch(r"whsec_[A-Za-z0-9_-]+", secret), secret
    await expect(panel.locator("tbody").first).to_contain_text("••••" + secret[-4:])

    await panel.get_by_role("button", name="Send test").click()
    await expect(page.locator(".toast").last).to_contain_text("Test event delivered (200)")
    log = panel.locator("section", has=page.get_by_role("heading", name="Delivery log"))
    await expect(log.locator("tbody tr")).to_have_count(1)
    await expect(log.locator("tbody tr")).to_contain_text("delivered")
    await expect(log.locator("tbody tr")).to_contain_text("webhook.test")
    assert len(receiver.received) == 1
    # Shown once: the tab loaded again has the hint only.
    await page.reload()
    await expect(page.locator("#tab-panel")).not_to_contain_text(secret)
    assert not errors, errors
