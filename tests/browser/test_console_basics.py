"""The console's first steps in a real browser: log in, create a project, log out;
and the rules every page follows (CSP, CSRF, login redirects, phone width)."""

from __future__ import annotations

import re

from playwright.async_api import Page, expect

from tests.support.browser import ADMIN_PASSWORD, Site, log_in_as_admin


async def test_log_in_create_a_project_and_log_out(page: Page, site: Site) -> None:
    console_errors: list[str] = []
    page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)

    await page.goto(f"{site.url}/projects")
    await expect(page).to_have_url(re.compile(r".*/login\?next=%2Fprojects$"))
    await page.get_by_label("Email").fill(site.admin_email)
    await page.get_by_label("Password").fill("wrong password")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("alert")).to_contain_text("invalid")
    await expect(page.get_by_label("Email")).to_have_value(site.admin_email)  # kept

    await page.get_by_label("Password").fill(ADMIN_PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(re.compile(r".*/projects$"))

    await page.get_by_role("button", name="Create project").click()
    await expect(page.locator("#project-name-error")).to_contain_text("name")
    await page.get_by_label("Name", exact=True).fill("Browser project")
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Browser project")
    await expect(page.get_by_role("tab", name="Custom LLMs")).to_be_visible()

    await page.get_by_role("button", name="Log out").click()
    await expect(page).to_have_url(re.compile(r".*/login$"))
    await page.goto(f"{site.url}/projects")
    await expect(page).to_have_url(re.compile(r".*/login.*"))
    assert not [e for e in console_errors if "Content Security Policy" in e], console_errors


async def test_a_form_post_without_the_csrf_token_is_refused(page: Page, site: Site) -> None:
    await log_in_as_admin(page, site)
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    response = await site.http.post(
        "/projects", data={"name": "forged"}, cookies={"arona_session": cookies["arona_session"]}
    )
    assert response.status_code == 403
    assert "forged" not in (await site.http.get("/api/projects")).text


async def test_pages_send_a_strict_content_security_policy(site: Site) -> None:
    response = await site.http.get("/login")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert "content-security-policy" not in (await site.http.get("/api/projects")).headers


async def test_the_console_fits_a_phone(page: Page, site: Site) -> None:
    await page.set_viewport_size({"width": 390, "height": 844})
    await log_in_as_admin(page, site)
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390


async def test_registering_opens_a_session_and_bad_input_stays_in_the_form(
    page: Page, site: Site
) -> None:
    await page.goto(f"{site.url}/register")
    await page.get_by_label("Name").fill("New Owner")
    await page.get_by_label("Email").fill("not-an-email")
    await page.get_by_label("Password (8 characters or more)").fill("short")
    await page.get_by_role("button", name="Register").click()
    await expect(page.locator("#email-error")).to_contain_text("email")
    await expect(page.locator("#password-error")).to_contain_text("8 characters")
    await expect(page.get_by_label("Name")).to_have_value("New Owner")

    email = f"owner-{site.admin_email.split('@')[0][-8:]}@browser.test"
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password (8 characters or more)").fill("a long enough password")
    await page.get_by_role("button", name="Register").click()
    await expect(page).to_have_url(re.compile(r".*/projects$"))
    await expect(page.locator(".who")).to_have_text(email)


async def test_unknown_pages_are_the_console_not_found_page(page: Page, site: Site) -> None:
    """A mistyped or stale link lands on a page in the console's layout with a way
    back, never on the API's JSON."""
    unknown_project = "0190a0a0-0000-7000-8000-000000000000"
    response = await page.goto(f"{site.url}/console/does-not-exist")
    assert response is not None
    assert response.status == 404
    await expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
    await expect(page.get_by_role("link", name="Arona")).to_be_visible()  # the layout
    await page.get_by_role("link", name="Back to your projects").click()
    await expect(page).to_have_url(re.compile(r".*/login\?next=%2Fprojects$"))

    await log_in_as_admin(page, site)
    for path, way_back in (
        (f"/projects/{unknown_project}/nothing", "Back to your projects"),
        (f"/projects/{unknown_project}", "Back to your projects"),
        ("/admin/nothing/here", "Back to the dashboard"),
    ):
        response = await page.goto(f"{site.url}{path}")
        assert response is not None
        assert response.status == 404, path
        await expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
        assert "application/json" not in (await response.all_headers())["content-type"]
        await expect(page.get_by_role("link", name=way_back)).to_be_visible()
    await page.get_by_role("link", name="Back to the dashboard").click()
    await expect(page).to_have_url(re.compile(r".*/admin$"))
