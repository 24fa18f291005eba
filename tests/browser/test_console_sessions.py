"""A session that expires while a form is open: the login page sends the visitor back
to the page the form was on (never to the POST-only address it posted to), and what
they typed (plain fields, never secrets) is put back with a note to submit again. And
the login page's ``next`` never leads off the site."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from playwright.async_api import Page, expect

from tests.browser.test_console_project import new_project, open_tab, watch_console
from tests.support.browser import ADMIN_PASSWORD, Site, log_in_as_admin

STORAGE_KEY = "arona:pending-form"
SOME_PROJECT = "/projects/0190a0a0-0000-7000-8000-000000000000"


async def expire_session(page: Page, site: Site) -> None:
    """End the browser's session on the server, as idle expiry does: the cookie stays."""
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    sessions = site.resources.web_sessions
    session = await sessions.load(cookies["arona_session"])
    assert session is not None
    await sessions.destroy(session)
    assert await sessions.load(cookies["arona_session"]) is None


async def log_in_again(page: Page, site: Site, next_page: str) -> None:
    login_url = r".*/login\?next=" + re.escape(quote(next_page, safe=""))
    await expect(page).to_have_url(re.compile(login_url))
    await page.get_by_label("Email").fill(site.admin_email)
    await page.get_by_label("Password").fill(ADMIN_PASSWORD)
    await page.get_by_role("button", name="Log in").click()


async def test_an_htmx_form_posted_after_expiry_is_restored_after_login(
    page: Page, site: Site
) -> None:
    errors = watch_console(page)
    secret_value = "sv-never-stored-" + "x" * 12
    project_id = await new_project(page, site, "Expiry project")
    await open_tab(page, "Secrets")
    tab_page = f"/projects/{project_id}/tabs/secrets"
    panel = page.locator("#tab-panel")
    await panel.get_by_label("Name", exact=True).fill("typed-before-expiry")
    await panel.get_by_label("Value", exact=True).fill(secret_value)
    await panel.get_by_label("Description (optional)").fill("kept across the login")

    await expire_session(page, site)
    await panel.get_by_role("button", name="Add secret").click()
    await expect(page).to_have_url(re.compile(r".*/login\?next=.*"))
    saved = await page.evaluate(f"sessionStorage.getItem({STORAGE_KEY!r})")
    assert "typed-before-expiry" in saved
    assert secret_value not in saved  # secret values never reach the browser's storage
    assert "csrf_token" not in saved

    await log_in_again(page, site, tab_page)
    await expect(page).to_have_url(re.compile(re.escape(tab_page) + "$"))
    panel = page.locator("#tab-panel")
    await expect(panel.get_by_label("Name", exact=True)).to_have_value("typed-before-expiry")
    await expect(panel.get_by_label("Description (optional)")).to_have_value(
        "kept across the login"
    )
    await expect(panel.get_by_label("Value", exact=True)).to_have_value("")
    await expect(panel.locator("[data-restored-note]")).to_contain_text("submit again")
    assert await page.evaluate(f"sessionStorage.getItem({STORAGE_KEY!r})") is None

    # Submitting again (the secret typed anew) saves it; a reload restores nothing more.
    await panel.get_by_label("Value", exact=True).fill(secret_value)
    await panel.get_by_role("button", name="Add secret").click()
    await expect(page.locator(".toast")).to_contain_text("Secret typed-before-expiry added")
    # An answered post leaves nothing behind to be put back by a later login.
    assert await page.evaluate(f"sessionStorage.getItem({STORAGE_KEY!r})") is None
    await page.reload()
    await expect(page.locator("#tab-panel tbody")).to_contain_text("typed-before-expiry")
    await expect(page.locator("[data-restored-note]")).to_have_count(0)
    assert not errors, errors


async def test_a_plain_form_posted_after_expiry_returns_to_its_page(page: Page, site: Site) -> None:
    await log_in_as_admin(page, site)
    await page.get_by_label("Name", exact=True).fill("Typed while expired")
    await page.get_by_label("Slug (optional)").fill("typed-while-expired")
    await expire_session(page, site)
    await page.get_by_role("button", name="Create project").click()

    await log_in_again(page, site, "/projects")
    await expect(page).to_have_url(re.compile(r".*/projects$"))  # not a 405 on a POST address
    await expect(page.get_by_label("Name", exact=True)).to_have_value("Typed while expired")
    await expect(page.get_by_label("Slug (optional)")).to_have_value("typed-while-expired")
    await expect(page.locator("[data-restored-note]")).to_contain_text("submit again")
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Typed while expired")


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example/x",
        "https://evil.example/",
        "/\\evil.example",
        "javascript:alert(1)",
        "/\t/evil.example",  # browsers drop tabs and newlines from URLs: "//evil.example"
    ],
)
async def test_login_never_sends_the_visitor_off_the_site(
    page: Page, site: Site, target: str
) -> None:
    await page.goto(f"{site.url}/login?next={quote(target, safe='')}")
    assert await page.locator("input[name=next]").input_value() == ""
    await page.get_by_label("Email").fill(site.admin_email)
    await page.get_by_label("Password").fill(ADMIN_PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(f"{site.url}/projects")

    # Signed in, the login page redirects at once: the same rule applies.
    await page.goto(f"{site.url}/login?next={quote(target, safe='')}")
    await expect(page).to_have_url(f"{site.url}/projects")


async def test_a_forged_next_in_the_login_post_is_refused(page: Page, site: Site) -> None:
    """The hidden field is the visitor's to edit: the post checks it again."""
    await page.goto(f"{site.url}/login")
    await page.locator("input[name=next]").evaluate("el => { el.value = '//evil.example/' }")
    await page.get_by_label("Email").fill(site.admin_email)
    await page.get_by_label("Password").fill(ADMIN_PASSWORD)
    await page.get_by_role("button", name="Log in").click()
    await expect(page).to_have_url(f"{site.url}/projects")


async def test_the_way_back_is_a_page_of_this_site(site: Site) -> None:
    """Over HTTP: an expired post names the page it came from, and only on this host."""
    host = site.url.split("://", 1)[1]
    cases: tuple[tuple[dict[str, str], str], ...] = (
        (
            {"HX-Request": "true", "HX-Current-URL": f"http://{host}/projects/x/tabs/keys?a=1"},
            "/projects/x/tabs/keys?a=1",
        ),
        ({"HX-Request": "true", "HX-Current-URL": "http://evil.example/projects"}, "/projects"),
        ({"Referer": f"http://{host}/admin/prices"}, "/admin/prices"),
        ({"Referer": "http://evil.example/admin/prices"}, "/projects"),
        ({"Referer": f"http://{host}//evil.example/"}, "/projects"),
        ({}, "/projects"),  # no hint at all: never the POST-only address
    )
    for headers, way_back in cases:
        response = await site.http.post(
            SOME_PROJECT + "/secrets", data={"name": "n"}, headers=headers, follow_redirects=False
        )
        login = response.headers.get("hx-redirect") or response.headers["location"]
        assert login == f"/login?next={quote(way_back, safe='')}", (headers, login)
