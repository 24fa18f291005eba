"""The dashboard's video jobs page over HTTP: who may see it, the admin cancel (CSRF
included) and its live stream. A live server with a real fake MiniMax behind it;
httpx clients carry a browser session cookie, as a browser would."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import update

from app.cli.bootstrap import create_admin
from app.db.models import User
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from tests.support.helpers import PASSWORD, console_login, unique_email
from tests.support.rpc import Replica, rpc_socket, serve, video_setup
from tests.support.settings import AppFactory
from tests.support.sse_frames import SseFrames
from tests.support.video import (
    Minimax,
    create_job,
    minimax,
    new_tenant,
    video_pg_settings,
    wait_status,
)

__all__ = ["minimax", "video_pg_settings"]

HTMX = {"HX-Request": "true"}
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')


@dataclass
class Browser:
    http: httpx.AsyncClient
    csrf: str

    def headers(self, htmx: bool = True) -> dict[str, str]:
        return {"X-CSRF-Token": self.csrf, **(HTMX if htmx else {})}


@pytest.fixture
async def live(video_pg_settings: Settings, make_app: AppFactory) -> AsyncIterator[Replica]:
    async with serve(make_app(video_pg_settings)) as replica:
        yield replica


async def _session(live: Replica, email: str) -> Browser:
    http = httpx.AsyncClient(base_url=live.url, timeout=30)
    response = await console_login(http, email)
    assert response.status_code == 303, response.text
    http.cookies.set("arona_session", response.cookies["arona_session"])
    found = CSRF.search((await http.get("/projects")).text)
    assert found
    return Browser(http, found.group(1))


@pytest.fixture
async def admin(live: Replica, fast_hasher: PasswordHasher) -> AsyncIterator[Browser]:
    email = unique_email("video-admin")
    await create_admin(live.resources.db_config, fast_hasher, email=email, password=PASSWORD)
    browser = await _session(live, email)
    yield browser
    await browser.http.aclose()


@pytest.fixture
async def member(live: Replica) -> AsyncIterator[Browser]:
    email = unique_email("video-member")
    response = await live.http.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD}
    )
    assert response.status_code == 201, response.text
    async with live.resources.db_config.get_session() as session:
        await session.execute(update(User).where(User.email == email).values(is_admin=False))
        await session.commit()
    browser = await _session(live, email)
    yield browser
    await browser.http.aclose()


def _row(html: str, job_id: str) -> str:
    """The table row of one job."""
    start = html.index(f'id="video-job-{job_id}"')
    return html[start : html.index("</tr>", start)]


async def test_the_page_lists_recent_jobs_of_every_project(
    live: Replica, admin: Browser, minimax: Minimax
) -> None:
    setup = await video_setup(live, minimax)
    other = await new_tenant(live.http)
    done = await create_job(live.http, setup.tenant.key, setup.model, "finished")
    stuck = await create_job(live.http, other.key, setup.model, "[stuck] going on")
    failed = await create_job(live.http, other.key, setup.model, "[fail:no luck] nope")
    await wait_status(live.http, setup.tenant.key, done["id"], ("done",))
    await wait_status(live.http, other.key, stuck["id"], ("running",))
    await wait_status(live.http, other.key, failed["id"], ("failed",))

    page = await admin.http.get("/admin/video")
    assert page.status_code == 200, page.text
    html = page.text
    assert 'aria-current="page">Video jobs' in html
    assert 'sse-connect="/admin/stream/video"' in html
    assert "style=" not in html
    done_row = _row(html, done["id"])
    assert setup.model in done_row
    assert setup.backend in done_row
    assert "Acme" in done_row  # the project's name
    assert ">done<" in done_row
    assert "0.2500" in done_row
    assert "Cancel" not in done_row
    stuck_row = _row(html, stuck["id"])
    assert ">running<" in stuck_row
    assert f'hx-post="/admin/video/{stuck["id"]}/cancel"' in stuck_row
    failed_row = _row(html, failed["id"])
    assert ">failed<" in failed_row
    assert "no luck" in failed_row
    assert "Cancel" not in failed_row

    rows = await admin.http.get("/admin/video/rows", headers=HTMX)
    assert rows.status_code == 200
    assert "<html" not in rows.text
    assert f'id="video-job-{stuck["id"]}"' in rows.text
    cancelled = await admin.http.post(f"/admin/video/{stuck['id']}/cancel", headers=admin.headers())
    assert cancelled.status_code == 200, cancelled.text


async def test_only_platform_admins_see_or_cancel(
    live: Replica, member: Browser, minimax: Minimax
) -> None:
    setup = await video_setup(live, minimax)
    job = await create_job(live.http, setup.tenant.key, setup.model, "[stuck] private")
    for path in ("/admin/video", "/admin/video/rows", "/admin/stream/video"):
        response = await member.http.get(path)
        assert response.status_code == 403, path
        assert "text/event-stream" not in response.headers["content-type"]
        anonymous = await live.http.get(path)
        assert anonymous.status_code in (302, 303), path
        assert anonymous.headers["location"].startswith("/login?next=")
    refused = await member.http.post(f"/admin/video/{job['id']}/cancel", headers=member.headers())
    assert refused.status_code == 403
    assert "toast" in refused.headers["hx-trigger"]
    still = await wait_status(live.http, setup.tenant.key, job["id"], ("queued", "running"))
    assert still["status"] in ("queued", "running")
    response = await live.http.post(
        f"/v1/video/generations/{job['id']}/cancel", headers=setup.tenant.key
    )
    assert response.status_code == 200


async def test_the_admin_cancel_needs_the_csrf_token_and_reaches_the_owner(
    live: Replica, admin: Browser, minimax: Minimax
) -> None:
    setup = await video_setup(live, minimax)
    headers = setup.tenant.key
    job = await create_job(live.http, headers, setup.model, "[stuck] to be cancelled")
    await wait_status(live.http, headers, job["id"], ("running",))
    path = f"/admin/video/{job['id']}/cancel"
    assert (await admin.http.post(path, headers=HTMX)).status_code == 403
    forged = await admin.http.post(path, data={"csrf_token": "not-the-token"})
    assert forged.status_code == 403
    assert (await wait_status(live.http, headers, job["id"], ("running",)))["status"] == "running"

    async with rpc_socket(live, headers) as owner:
        subscribed = await owner.call("video.subscribe", {"stream_id": job["stream_id"]})
        assert subscribed["result"]["status"] == "running"
        await owner.next_note(job["stream_id"])
        cancelled = await admin.http.post(path, headers=admin.headers())
        assert cancelled.status_code == 200, cancelled.text
        toast = json.loads(cancelled.headers["hx-trigger"])["toast"]
        assert toast["level"] == "success"
        assert job["id"] in toast["message"]
        assert ">cancelled<" in _row(cancelled.text, job["id"])
        assert "Cancel" not in _row(cancelled.text, job["id"])
        notes = await owner.stream(job["stream_id"])
    assert notes[-1] == (
        "video.failed",
        {"job_id": job["id"], "stream_id": job["stream_id"], "error": "cancelled"},
    )
    shown = await wait_status(live.http, headers, job["id"], ("cancelled",))
    assert shown["error"]["message"] == "cancelled"

    again = await admin.http.post(path, headers=admin.headers())
    assert again.status_code == 409
    assert json.loads(again.headers["hx-trigger"])["toast"]["level"] == "error"
    missing = await admin.http.post("/admin/video/vid_nope/cancel", headers=admin.headers())
    assert missing.status_code == 404
    # Without htmx (a plain form post with the token field): back to the page.
    other = await create_job(live.http, headers, setup.model, "[stuck] plain form")
    plain = await admin.http.post(
        f"/admin/video/{other['id']}/cancel", data={"csrf_token": admin.csrf}
    )
    assert plain.status_code == 303
    assert plain.headers["location"] == "/admin/video"
    await wait_status(live.http, headers, other["id"], ("cancelled",))


async def test_the_stream_shows_new_jobs_and_their_progress_live(
    live: Replica, admin: Browser, minimax: Minimax
) -> None:
    setup = await video_setup(live, minimax)
    async with admin.http.stream("GET", "/admin/stream/video") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = SseFrames(response)
        await frames.until("video-jobs")  # the snapshot
        job = await create_job(live.http, setup.tenant.key, setup.model, "[slow:3] live")
        rows = await frames.until("video-jobs", f'id="video-job-{job["id"]}"')
        row = _row(rows, job["id"])
        assert 'data-status="done"' not in row  # it shows up before it is done
        assert f'sse-swap="video-{job["id"]}-status"' in row
        # From then on only its cells follow, each once it changed.
        status = await frames.until(f"video-{job['id']}-status", 'data-status="done"')
        assert ">done<" in status
        cost = await frames.until(f"video-{job['id']}-cost")
        assert "0.2500" in cost
        actions = await frames.until(f"video-{job['id']}-actions")
        assert "Cancel" not in actions
