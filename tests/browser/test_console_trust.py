"""What makes the console trustworthy in a real browser: a clean browser console (no
CSP violation on any swap), errors that go away once fixed, a copy that works on plain
HTTP, a live indicator that tells the truth, and a dark theme."""

from __future__ import annotations

import re
import uuid

from playwright.async_api import Browser, Page, expect

from tests.support.browser import ADMIN_PASSWORD, Site, log_in_as_admin

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


def _rgb(css: str) -> tuple[int, int, int]:
    red, green, blue = (int(x) for x in re.findall(r"\d+", css)[:3])
    return red, green, blue


def _contrast(one: str, two: str) -> float:
    """WCAG contrast ratio of two computed colours."""

    def luminance(css: str) -> float:
        channels = [c / 255 for c in _rgb(css)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    light, dark = sorted((luminance(one), luminance(two)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


async def _colours(page: Page, selector: str) -> tuple[str, str]:
    # Looked up and read in one go: a live refresh may replace the element meanwhile.
    found: list[str] = await page.evaluate(
        "s => { const c = getComputedStyle(document.querySelector(s));"
        " return [c.color, c.backgroundColor]; }",
        selector,
    )
    return found[0], found[1]


async def test_the_theme_follows_the_system_setting(site: Site, browser: Browser) -> None:
    dark = await browser.new_context(color_scheme="dark", viewport={"width": 1280, "height": 900})
    light = await browser.new_context(color_scheme="light", viewport={"width": 1280, "height": 900})
    try:
        page = await light.new_page()
        await log_in_as_admin(page, site)
        # The light theme is what it was.
        assert await _colours(page, "body") == ("rgb(29, 35, 48)", "rgb(246, 247, 249)")
        assert (await _colours(page, "table"))[1] == "rgb(255, 255, 255)"

        page = await dark.new_page()
        await log_in_as_admin(page, site)
        fg, bg = await _colours(page, "body")
        assert sum(_rgb(bg)) < 3 * 60, bg  # a dark background
        assert _contrast(fg, bg) >= 7, (fg, bg)
        card = (await _colours(page, "table"))[1]
        assert sum(_rgb(card)) < 3 * 60, card
        assert _contrast((await _colours(page, "td"))[0], card) >= 4.5
        assert _contrast((await _colours(page, "th"))[0], card) >= 4.5  # muted headings
        # A form: its field, its button, a refusal beside the field.
        await page.get_by_role("button", name="Create project").click()
        await expect(page.locator("#project-name-error")).to_be_visible()
        field_fg, field_bg = await _colours(page, "#project-name")
        assert sum(_rgb(field_bg)) < 3 * 60, field_bg
        assert _contrast(field_fg, field_bg) >= 7, (field_fg, field_bg)
        error = (await _colours(page, "#project-name-error"))[0]
        assert _contrast(error, card) >= 4.5, error
        assert _contrast(*await _colours(page, "main button")) >= 4.5
        # Status colours on the dashboard: badges keep their meaning and stay readable.
        token = await site.http.post(
            "/api/auth/login", json={"email": site.admin_email, "password": ADMIN_PASSWORD}
        )
        headers = {"Authorization": f"Bearer {token.json()['accessToken']}"}
        name = f"dark-{uuid.uuid4().hex[:8]}"
        registered = await site.http.post(
            "/api/admin/backends",
            json={"name": name, "type": "external", "url": "http://127.0.0.1:9"},
            headers=headers,
        )
        assert registered.status_code == 201, registered.text
        await page.goto(f"{site.url}/admin/backends")
        badge = f"#backend-{name} .health-badge"
        await expect(page.locator(badge)).to_have_text("unhealthy")
        assert _contrast(*await _colours(page, badge)) >= 4.5
    finally:
        await dark.close()
        await light.close()
