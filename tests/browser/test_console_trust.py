"""What makes the console trustworthy in a real browser: a clean browser console (no
CSP violation on any swap), errors that go away once fixed, a copy that works on plain
HTTP, a live indicator that tells the truth, and a dark theme."""

from __future__ import annotations

import re
import uuid

from playwright.async_api import Page, expect

from tests.support.browser import Site, log_in_as_admin

# Collects every CSP violation the page reports, from its first script on.
_CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || '') + ' '
    + (e.sourceFile || '') + ':' + e.lineNumber + ' ' + (e.sample || ''));
});
"""


async def _violations(page: Page) -> list[str]:
    found: list[str] = await page.evaluate("window.__cspViolations")
    return found


async def test_form_swaps_and_live_refreshes_keep_the_csp_clean(site: Site, page: Page) -> None:
    await page.add_init_script(_CSP_WATCH)
    await log_in_as_admin(page, site)
    # A console form refused, then accepted (an htmx swap each time).
    await page.get_by_label("Name", exact=True).fill("CSP project")
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("CSP project")
    await page.get_by_role("tab", name="Secrets").click()
    panel = page.locator("#tab-panel")
    await expect(panel.get_by_label("Value", exact=True)).to_be_visible()
    # What password managers and autofill do to a field (through the CSSOM, which the
    # CSP allows): htmx must not copy it back as a style attribute on the next swap.
    await page.evaluate(
        "document.getElementById('secret-name').style.backgroundImage = 'none';"
        "document.getElementById('secret-value').style.removeProperty('color')"
    )
    await panel.get_by_role("button", name="Add secret").click()
    await expect(panel.locator(".field-error").first).to_be_visible()
    await panel.get_by_label("Name", exact=True).fill("csp-secret")
    await panel.get_by_label("Value", exact=True).fill("value-0001")
    await panel.get_by_role("button", name="Add secret").click()
    await expect(panel.locator("tbody")).to_contain_text("csp-secret")
    assert await _violations(page) == []

    # A dashboard form and the live refreshes it causes over SSE.
    name = f"csp-{uuid.uuid4().hex[:8]}"
    await page.goto(f"{site.url}/admin/backends")
    await page.evaluate("document.getElementById('backend-url').style.backgroundImage = 'none'")
    await page.get_by_role("button", name="Register backend").click()
    await expect(page.locator("#backend-editor .field-error").first).to_be_visible()
    await page.get_by_label("Name", exact=True).fill(name)
    await page.get_by_label("Base URL").fill("http://127.0.0.1:9")
    await page.get_by_role("button", name="Register backend").click()
    await expect(page.locator(f"#backend-{name}")).to_be_visible()
    clock = page.locator('[sse-swap="backends-clock"] time')
    seen = await clock.get_attribute("datetime")
    await expect(clock).not_to_have_attribute("datetime", seen or "")
    seen = await clock.get_attribute("datetime")
    await expect(clock).not_to_have_attribute("datetime", seen or "")
    assert await _violations(page) == []
    # The watcher itself works: an inline style attribute is reported.
    await page.evaluate("document.body.setAttribute('style', 'color: red')")
    await page.wait_for_function("window.__cspViolations.length > 0")
    assert "style-src-attr" in (await _violations(page))[0]


RED_BORDER = "rgb(179, 38, 30)"  # --bad in arona.css


async def test_a_fixed_field_loses_its_error(site: Site, page: Page) -> None:
    await log_in_as_admin(page, site)
    await page.get_by_label("Name", exact=True).fill("Errors project")
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Errors project")
    await page.get_by_role("tab", name="Secrets").click()
    panel = page.locator("#tab-panel")
    name, value = panel.get_by_label("Name", exact=True), panel.get_by_label("Value", exact=True)
    await expect(value).to_be_visible()
    # No value: the value is refused.
    await name.fill("fixed-name")
    await panel.get_by_role("button", name="Add secret").click()
    await expect(panel.locator("#secret-value-error")).to_be_visible()
    await expect(value).to_have_attribute("aria-invalid", "true")
    await expect(value).to_have_css("border-top-color", RED_BORDER)

    # The value filled without a keystroke (as a password manager does), the name
    # broken: the re-rendered form keeps the value as typed (hx-preserve keeps the old
    # element) and marks only the name; the value's old error state does not survive.
    await page.evaluate("document.getElementById('secret-value').value = 'value-0002'")
    await name.fill("not a valid name!")
    await panel.get_by_role("button", name="Add secret").click()
    await expect(panel.locator("#secret-name-error")).to_be_visible()
    await expect(name).to_have_attribute("aria-invalid", "true")
    await expect(name).to_have_css("border-top-color", RED_BORDER)
    await expect(value).to_have_value("value-0002")
    await expect(value).not_to_have_attribute("aria-invalid", "true")
    await expect(value).not_to_have_css("border-top-color", RED_BORDER)
    await expect(value).to_have_attribute("aria-describedby", "secret-value-hint")
    await expect(panel.locator("#secret-value-error")).to_have_count(0)

    # Edited: the red border and the message beside it go at once, the hint stays.
    await name.fill("fixed-name")
    await expect(name).not_to_have_attribute("aria-invalid", "true")
    await expect(name).not_to_have_css("border-top-color", RED_BORDER)
    await expect(panel.locator("#secret-name-error")).to_have_count(0)
    await expect(name).to_have_attribute("aria-describedby", "secret-name-hint")

    await panel.get_by_role("button", name="Add secret").click()
    await expect(panel.locator("tbody")).to_contain_text("fixed-name")


async def _new_key(page: Page, site: Site, project: str) -> str:
    """A project and a new API key through the console; returns the key shown once."""
    await log_in_as_admin(page, site)
    await page.get_by_label("Name", exact=True).fill(project)
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(project)
    await page.get_by_role("tab", name="Keys").click()
    panel = page.locator("#tab-panel")
    await panel.get_by_label("Name of the new API key").fill("ci")
    await panel.get_by_role("button", name="Create API key").click()
    once = panel.locator(".secret-once")
    await expect(once).to_have_text(re.compile(r"^ak-\S{20,}$"))
    return (await once.text_content() or "").strip()


async def test_copy_puts_a_key_on_the_clipboard_in_a_secure_context(site: Site, page: Page) -> None:
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    key = await _new_key(page, site, "Copy project")
    assert await page.evaluate("window.isSecureContext")  # loopback counts as secure
    await page.get_by_role("button", name="Copy API key").click()
    await expect(page.locator(".copy-hint")).to_have_text("Copied.")
    assert await page.evaluate("navigator.clipboard.readText()") == key


async def test_without_a_clipboard_copy_selects_the_key_and_says_how(
    site: Site, page: Page
) -> None:
    # As on a plain-HTTP address: no clipboard API at all.
    await page.add_init_script("delete Navigator.prototype.clipboard;")
    await page.set_viewport_size({"width": 390, "height": 844})
    key = await _new_key(page, site, "Plain HTTP project")
    assert await page.evaluate("navigator.clipboard") is None
    await page.get_by_role("button", name="Copy API key").click()
    hint = page.locator(".copy-hint")
    await expect(hint).to_have_text(re.compile(r"press (Ctrl\+C|⌘C) to copy"))
    await expect(hint).to_have_attribute("role", "status")
    assert await page.evaluate("window.getSelection().toString()") == key
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
