"""Browser tests: a live Arona (uvicorn on a loopback port, its own PostgreSQL database
and Redis), driven by Playwright in Debian's Chromium (``/usr/bin/chromium``, installed by
``make browser``; the tests never download a browser). On a machine without apt,
``make browser`` installs Playwright's own Chromium instead. A failing test leaves a
screenshot under ``test-results/browser/``.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from app.cli.bootstrap import create_admin
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.server.resources import Resources
from tests.support.auth import fresh_database
from tests.support.browser import ADMIN_PASSWORD, CHROMIUM, SCREENSHOTS, TIMEOUT_MS, Site
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings


@pytest.fixture(scope="module")
async def browser_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("browser")) as settings:
        yield with_settings(
            settings,
            registration_open=True,
            custom_llm_allow_private=True,
            health_interval_seconds=0.5,
        )


@pytest.fixture
async def site(
    browser_settings: Settings, make_app: AppFactory, fast_hasher: PasswordHasher
) -> AsyncIterator[Site]:
    app = make_app(browser_settings)
    resources: Resources = app.state.resources
    email = f"admin-{uuid.uuid4().hex[:8]}@browser.test"
    await create_admin(resources.db_config, fast_hasher, email=email, password=ADMIN_PASSWORD)
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(live_server(app))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield Site(url=url, resources=resources, admin_email=email, http=http)


def _chromium_executable(bundled: str) -> str:
    """Debian's Chromium (or ``ARONA_TEST_CHROMIUM``); on a machine without apt,
    ``make browser`` installs Playwright's own build instead, used when present."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if "ARONA_TEST_CHROMIUM" not in os.environ and Path(bundled).exists():
        return bundled
    pytest.fail(f"{CHROMIUM} is missing: run `make browser`")


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        executable = _chromium_executable(playwright.chromium.executable_path)
        launched = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        yield launched
        await launched.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
async def context(
    browser: Browser, request: pytest.FixtureRequest
) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    yield ctx
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
        for index, page in enumerate(ctx.pages):
            with contextlib.suppress(Exception):
                await page.screenshot(path=str(SCREENSHOTS / f"{name}-{index}.png"), full_page=True)
    await ctx.close()


@pytest.fixture
async def page(context: BrowserContext) -> Page:
    return await context.new_page()
