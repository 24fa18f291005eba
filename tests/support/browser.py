"""A live Arona driven by Playwright: the site under test and logging in."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
from playwright.async_api import Page

from app.lib.settings import Settings
from app.server.resources import Resources

CHROMIUM = os.environ.get("ARONA_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-results" / "browser"
ADMIN_PASSWORD = "browser-admin-" + "p" * 12
TIMEOUT_MS = 10_000


@dataclass
class Site:
    url: str
    resources: Resources
    admin_email: str
    http: httpx.AsyncClient

    @property
    def settings(self) -> Settings:
        return self.resources.settings


async def log_in(page: Page, site: Site, email: str, password: str) -> None:
    await page.goto(f"{site.url}/login")
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url(re.compile(r".*/projects$"))


async def log_in_as_admin(page: Page, site: Site) -> None:
    await log_in(page, site, site.admin_email, ADMIN_PASSWORD)
