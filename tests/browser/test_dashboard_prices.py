"""The price book page in a real browser: an admin adds a price through the htmx
form, the table refreshes without a reload, a bad amount is shown next to its field,
and a future price is deleted from its row.

``site`` comes before ``page`` in every signature: the browser closes first.
"""

from __future__ import annotations

import uuid

from playwright.async_api import Dialog, Page, expect

from tests.support.browser import Site, log_in_as_admin


def _accept_dialogs(page: Page) -> None:
    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)


async def _add_future_price(page: Page, model: str) -> None:
    """Submit a price of ``model`` that comes into force in 2099 (deletable)."""
    form = page.locator("#price-editor form")
    await form.get_by_label("Model").fill(model)
    await form.get_by_label("Input", exact=True).fill("0.1")
    await form.get_by_label("Output", exact=True).fill("0.4")
    await form.get_by_label("In force from (UTC)").fill("2099-01-01T00:00")
    await form.get_by_role("button", name="Add price").click()


async def test_an_admin_adds_a_price_and_deletes_a_future_one(site: Site, page: Page) -> None:
    model = f"browser-price-{uuid.uuid4().hex[:8]}"
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin")
    sections = page.get_by_role("navigation", name="Dashboard sections")
    await sections.get_by_role("link", name="Prices").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Prices")
    await page.evaluate("window.aronaTestMarker = 'same page'")

    form = page.locator("#price-editor form")
    await form.get_by_label("Model").fill(model)
    await form.get_by_label("Input", exact=True).fill("-3")
    await form.get_by_label("Output", exact=True).fill("0.6")
    await form.get_by_role("button", name="Add price").click()
    await expect(page.locator("#price-input-error")).to_contain_text("non-negative")

    await page.locator("#price-editor form").get_by_label("Input", exact=True).fill("0.15")
    await page.locator("#price-editor form").get_by_role("button", name="Add price").click()
    await expect(page.locator("#toasts")).to_contain_text(f"Price of {model} added")
    rows = page.locator("#price-rows tr", has_text=model)
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("0.15 USD")
    await expect(rows.first).to_contain_text("in force")
    await expect(rows.first.get_by_role("button")).to_have_count(0)  # history

    await _add_future_price(page, model)
    await expect(rows).to_have_count(2)
    future = page.locator("#price-rows tr", has_text="future")
    await expect(future).to_contain_text("2099-01-01 00:00:00")
    # A live refresh can replace the row before the answer comes (the agents page's
    # SSE update did in CI): the answer's toast must still show.
    await page.evaluate(
        """document.addEventListener("htmx:beforeRequest", (event) => {
            const row = event.detail.elt.closest("tr");
            if (row) { row.replaceWith(row.cloneNode(true)); }
        }, { once: true })"""
    )
    _accept_dialogs(page)
    await future.get_by_role("button", name=f"Delete the future price of {model}").click()
    await expect(page.locator("#toasts")).to_contain_text("Price deleted")
    await expect(page.locator("#toasts .toast", has_text="Price deleted")).to_have_count(1)
    assert await page.evaluate("window.aronaTestMarker") == "same page"
    await page.reload()  # the row the test replaced is gone from the server's table
    await expect(rows).to_have_count(1)


async def test_a_toast_shows_once_when_the_answer_swaps_its_own_row(site: Site, page: Page) -> None:
    model = f"browser-price-{uuid.uuid4().hex[:8]}"
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin/prices")
    await page.evaluate("window.aronaTestMarker = 'same page'")
    await _add_future_price(page, model)
    rows = page.locator("#price-rows tr", has_text=model)
    await expect(rows).to_have_count(1)
    _accept_dialogs(page)
    await rows.get_by_role("button", name=f"Delete the future price of {model}").click()
    await expect(rows).to_have_count(0)
    await expect(page.locator("#toasts .toast", has_text="Price deleted")).to_have_count(1)
    assert await page.evaluate("window.aronaTestMarker") == "same page"
