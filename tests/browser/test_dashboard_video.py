"""The video jobs page in a real browser.

A job created over REST shows up on the open page and reaches ``done`` live (SSE from
the ``video.jobs`` channel; the page is never reloaded), and a job created over
JSON-RPC is cancelled from the page, which its owner then sees through the API.
The fake MiniMax is a real HTTP server registered as a ``minimax-cloud`` backend.

``site`` comes before ``page`` in every signature: the browser closes first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Dialog, Page, expect

from app.lib.settings import Settings
from tests.support.auth import fresh_database
from tests.support.browser import Site, log_in_as_admin
from tests.support.routing import ADMIN_TOKEN
from tests.support.rpc import PRICE, Replica, call, result, video_setup
from tests.support.settings import with_settings
from tests.support.video import VIDEO_TEST_SETTINGS, Minimax, create_job, minimax

__all__ = ["minimax"]


@pytest.fixture(scope="module")
async def browser_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    """The browser tests' settings, plus the admin API token and fast video polls."""
    async with fresh_database("postgres", tmp_path_factory.mktemp("browser-video")) as settings:
        yield with_settings(
            settings,
            registration_open=True,
            health_interval_seconds=0.5,
            **{**VIDEO_TEST_SETTINGS, "admin_token": ADMIN_TOKEN},
        )


def _accept_dialogs(page: Page) -> None:
    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)


async def test_jobs_appear_live_reach_done_and_can_be_cancelled(
    site: Site, minimax: Minimax, page: Page
) -> None:
    replica = Replica(site.url, app=None, http=site.http)  # type: ignore[arg-type]
    setup = await video_setup(replica, minimax)
    headers = setup.tenant.key
    toasts = page.locator("#toasts")
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin")
    sections = page.get_by_role("navigation", name="Dashboard sections")
    await sections.get_by_role("link", name="Video jobs").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Video jobs")
    # A marker a reload would wipe: everything below arrives over SSE.
    await page.evaluate("window.aronaTestMarker = 'same page'")

    made = await create_job(site.http, headers, setup.model, "[slow:8] a browser cat")
    row = page.locator(f"#video-job-{made['id']}")
    await expect(row).to_contain_text(setup.model)
    await expect(row).to_contain_text(setup.backend)
    status = row.locator(".video-status")
    await expect(status).to_have_text("done", timeout=30_000)
    await expect(row.locator(".video-progress")).to_have_text("100 %")
    await expect(row.locator(".video-cost")).to_have_text(f"{PRICE:.4f}")
    await expect(row.get_by_role("button")).to_have_count(0)

    stuck = {"model": setup.model, "prompt": "[stuck] cancel me"}
    created = result(await call(site.http, headers, "video.create", stuck))
    job_id = created["job_id"]
    other = page.locator(f"#video-job-{job_id}")
    await expect(other.locator(".video-status")).to_have_text("running", timeout=15_000)
    _accept_dialogs(page)
    await other.get_by_role("button", name=f"Cancel job {job_id}").click()
    await expect(toasts).to_contain_text(f"Video job {job_id} ({setup.model}) cancelled")
    await expect(other.locator(".video-status")).to_have_text("cancelled")
    await expect(other.get_by_role("button")).to_have_count(0)
    seen = result(await call(site.http, headers, "video.get", {"job_id": job_id}))
    assert seen["status"] == "cancelled"
    assert seen["error"]["message"] == "cancelled"
    assert await page.evaluate("window.aronaTestMarker") == "same page"
