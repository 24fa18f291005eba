"""The admin dashboard in a real browser: live backend health over SSE (an upstream
stopped and started again on the same port), the latency-failover switch and its
per-profile status, clearing a sticky pin, and the page rules (CSP, phone width).

``site`` comes before ``page`` in every signature: fixtures are torn down in reverse,
so the browser (and its open SSE connections) closes before the server stops.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from playwright.async_api import ConsoleMessage, Dialog, Page, Route, expect
from sqlalchemy import func, select

from app.db.models import Conversation, FallbackPin, Project
from app.domain.dashboard import stream
from app.domain.dashboard.feeds import BackendsFeed
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.fakes.vllm_upstream import FakeVllm
from app.lib.ports import free_port
from tests.support.browser import ADMIN_PASSWORD, Site, log_in_as_admin

OK = re.compile(r"(^|\s)ok(\s|$)")
BAD = re.compile(r"(^|\s)bad(\s|$)")
RED = "rgb(255, 244, 243)"  # tr:has(.health-badge.bad) in arona.css
GREEN = "rgb(27, 127, 59)"  # --ok in arona.css: the live dot


def _name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


async def _admin_api(site: Site) -> dict[str, str]:
    response = await site.http.post(
        "/api/auth/login", json={"email": site.admin_email, "password": ADMIN_PASSWORD}
    )
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['accessToken']}"}


def _accept_dialogs(page: Page) -> None:
    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)


def _csp_errors(page: Page) -> list[str]:
    errors: list[str] = []

    def record(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", record)
    return errors


async def test_a_backend_row_turns_red_and_green_live(site: Site, page: Page) -> None:
    errors = _csp_errors(page)
    port, name = free_port(), _name("live")
    fake = FakeVllm("dashboard-vllm", models=["qwen3-8b"])
    await log_in_as_admin(page, site)
    await page.get_by_role("link", name="Dashboard").click()
    sections = page.get_by_role("navigation", name="Dashboard sections")
    await sections.get_by_role("link", name="Backends").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Backends")

    # Register it through the vLLM form, while nothing listens on its port yet.
    await page.get_by_label("Name", exact=True).fill(name)
    await page.get_by_label("Type").select_option("vllm")
    await expect(page.locator("#backend-editor")).to_contain_text("load is read from")
    await expect(page.get_by_label("Name", exact=True)).to_have_value(name)  # kept
    await page.get_by_label("Base URL").fill(f"http://127.0.0.1:{port}")
    await page.get_by_role("button", name="Register backend").click()
    await expect(page.locator("#toasts")).to_contain_text(f"Backend {name} registered")
    row = page.locator(f"#backend-{name}")
    health = row.locator(".health-badge")
    await expect(health).to_have_class(BAD)
    await expect(row).to_have_css("background-color", RED)
    await expect(health).to_have_text("unhealthy")
    await expect(row).to_contain_text("metrics unavailable")
    # A marker that a reload would wipe: every change below arrives over SSE.
    await page.evaluate("window.aronaTestMarker = 'still the same page'")

    async with serve_asgi(fake, port=port):
        await expect(health).to_have_class(OK)
        await expect(health).to_have_text("healthy")
        await expect(row).not_to_have_css("background-color", RED)
        await expect(row).to_contain_text("qwen3-8b")  # discovered by the probe
        fake.running, fake.waiting, fake.kv_cache = 3, 2, 0.5
        load = row.locator("dl.load")
        await expect(load).to_contain_text("Running3", timeout=10_000)  # on the timer
        await expect(load).to_contain_text("Waiting2")
        await expect(load).to_contain_text("50.0 %")
        await expect(load).to_contain_text("Score23")  # 3 + 10 * 2 + 0 in flight
    # Stopped: red within a probe interval (0.5 s here) and the event's delivery.
    await expect(health).to_have_class(BAD, timeout=3000)
    await expect(health).to_have_text("unhealthy")
    await expect(row).to_have_css("background-color", RED)
    async with serve_asgi(fake, port=port):
        await expect(health).to_have_class(OK, timeout=3000)
    assert await page.evaluate("window.aronaTestMarker") == "still the same page"

    # Probe now, and remove with a confirmation.
    await page.get_by_role("button", name=f"Probe now {name}").click()
    await expect(page.locator("#toasts")).to_contain_text(f"{name}: unhealthy")
    _accept_dialogs(page)
    await page.get_by_role("button", name=f"Remove {name}").click()
    await expect(row).to_have_count(0)
    gone = await site.http.get(f"/api/admin/backends/{name}", headers=await _admin_api(site))
    assert gone.status_code == 404
    assert not [e for e in errors if "Content Security Policy" in e], errors


async def test_the_latency_failover_switch_changes_the_live_status(site: Site, page: Page) -> None:
    headers = await _admin_api(site)
    backend, fast, slow = _name("pool"), _name("fast"), _name("slow")
    fake = FakeOpenAI("failover-upstream", models=["gpt-4o-mini"])
    async with serve_asgi(fake) as url:
        registered = await site.http.post(
            "/api/admin/backends",
            json={"name": backend, "type": "external", "url": url},
            headers=headers,
        )
        assert registered.status_code == 201, registered.text
        for profile_id, extra in (
            (fast, {}),
            (slow, {"slowThresholdMs": 100, "failoverChain": [fast]}),
        ):
            created = await site.http.post(
                "/api/admin/model-profiles",
                json={
                    "id": profile_id,
                    "name": profile_id.title(),
                    "baseModel": "gpt-4o-mini",
                    **extra,
                },
                headers=headers,
            )
            assert created.status_code == 201, created.text
        await _wait_routable(site, backend)

        await log_in_as_admin(page, site)
        await page.goto(f"{site.url}/admin/failover")
        status = page.locator(f"#failover-{slow} .status")
        await expect(status).to_have_text("ok")
        # Slow answers (as the runtime chat records them) make it redirect, live.
        policy = site.resources.failover_control.policy
        for _ in range(site.settings.failover_min_samples):
            policy.record(slow, 5000.0)
        await expect(status).to_have_text(f"redirecting to {fast.title()}")
        await expect(page.locator(f"#failover-{slow}")).to_contain_text("5,000 ms")

        # The switch, by keyboard: off keeps traffic on the slow profile.
        await page.get_by_role("button", name="Turn failover off").focus()
        await page.keyboard.press("Enter")
        await expect(page.locator("#failover-state")).to_have_text("off")
        await expect(status).to_have_text("slow")
        await expect(page.locator("#toasts")).to_contain_text("Latency failover is off.")
        await page.get_by_role("button", name="Turn failover on").click()
        await expect(page.locator("#failover-state")).to_have_text("on")
        await expect(status).to_have_text(f"redirecting to {fast.title()}")
        assert policy.enabled is True


async def _wait_routable(site: Site, backend: str) -> None:
    async with asyncio.timeout(10):
        while True:
            state = site.resources.backend_registry.get(backend)
            if state is not None and state.health.healthy and "gpt-4o-mini" in state.models:
                return
            await asyncio.sleep(0.05)


async def test_clearing_a_sticky_pin(site: Site, page: Page) -> None:
    headers = await _admin_api(site)
    created = await site.http.post(
        "/api/projects", json={"name": "Pinned", "slug": _name("pinned")}, headers=headers
    )
    assert created.status_code == 201, created.text
    project_id, conversation_id = uuid.UUID(created.json()["id"]), uuid.uuid4()
    async with site.resources.db_config.get_session() as session:
        assert await session.get(Project, project_id) is not None
        session.add(Conversation(id=conversation_id, project_id=project_id, title="dropped"))
        await session.flush()
        session.add(
            FallbackPin(
                conversation_id=conversation_id,
                project_id=project_id,
                from_profile_id="primary",
                to_profile_id="fallback",
                reason="upstream_dropped",
                backend="vllm-a",
            )
        )
        await session.commit()

    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin/failover")
    pin = page.locator(f"#pin-{conversation_id}")
    await expect(pin).to_contain_text("Pinned")
    await expect(pin).to_contain_text("primary → fallback")
    # The stream's first message replaces every live part, the pins list included: a
    # click that lands while it is swapped loses its toast (the event has no document
    # to bubble to). Wait until the stream is live, as a person would see it tick.
    clock = page.locator('[sse-swap="failover-clock"] time')
    rendered = await clock.get_attribute("datetime")
    await expect(clock).not_to_have_attribute("datetime", rendered or "")
    _accept_dialogs(page)
    await pin.get_by_role("button", name=re.compile("^Clear")).click()
    await expect(pin).to_have_count(0)
    await expect(page.locator("#toasts")).to_contain_text("follows its own profile again")
    async with site.resources.db_config.get_session() as session:
        left = await session.scalar(
            select(func.count())
            .select_from(FallbackPin)
            .where(FallbackPin.conversation_id == conversation_id)
        )
    assert left == 0


async def test_every_dashboard_page_fits_a_phone_and_keeps_the_csp(site: Site, page: Page) -> None:
    errors = _csp_errors(page)
    await page.set_viewport_size({"width": 390, "height": 844})
    await log_in_as_admin(page, site)
    for path in (
        "/admin",
        "/admin/backends",
        "/admin/aliases",
        "/admin/profiles",
        "/admin/failover",
        "/admin/projects",
        "/admin/usage",
    ):
        await page.goto(f"{site.url}{path}")
        await expect(page.get_by_role("heading", level=1)).to_be_visible()
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, (path, width)
    assert not [e for e in errors if "Content Security Policy" in e], errors


async def test_a_live_page_reconnects_by_itself(
    site: Site, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Streams end after a second (as after a dropped connection or a replica restart);
    # the page must come back on its own and keep following the bus.
    monkeypatch.setattr(stream, "MAX_SECONDS", 1.0)
    headers = await _admin_api(site)
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin/failover")
    await expect(page.locator("#failover-state")).to_have_text("on")
    await page.evaluate(
        "window.aronaOpens = 0;"
        "document.body.addEventListener('htmx:sseOpen', () => { window.aronaOpens += 1; });"
    )
    await page.wait_for_function("() => window.aronaOpens >= 2", timeout=15_000)
    try:
        # Changed elsewhere (the JSON admin API), seen here over a reconnected stream.
        turned = await site.http.put(
            "/api/admin/failover", json={"enabled": False}, headers=headers
        )
        assert turned.status_code == 200, turned.text
        await expect(page.locator("#failover-state")).to_have_text("off")
    finally:
        await site.http.put("/api/admin/failover", json={"enabled": True}, headers=headers)


async def test_a_page_whose_stream_is_down_says_so_and_comes_back(
    site: Site, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Streams end after a second; while the stream URL is unreachable the page must
    # stop claiming to be live, mark what it shows as stale, and keep retrying.
    monkeypatch.setattr(stream, "MAX_SECONDS", 1.0)
    errors = _csp_errors(page)
    name = _name("stale")
    registered = await site.http.post(
        "/api/admin/backends",
        json={"name": name, "type": "external", "url": f"http://127.0.0.1:{free_port()}"},
        headers=await _admin_api(site),
    )
    assert registered.status_code == 201, registered.text
    await page.set_viewport_size({"width": 390, "height": 844})
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin/backends")
    pool = page.locator('[sse-connect="/admin/stream/backends"]')
    state = pool.locator(".live-state")
    dot = pool.locator(".live-dot")
    await expect(state).to_have_text("Live")
    await expect(dot).to_have_css("background-color", GREEN)
    await page.evaluate(
        "window.aronaOpens = 0;"
        "document.body.addEventListener('htmx:sseOpen', () => { window.aronaOpens += 1; });"
    )

    async def refuse(route: Route) -> None:
        await route.abort("connectionrefused")

    await page.route("**/admin/stream/**", refuse)
    await expect(state).to_have_text("Disconnected", timeout=8000)
    await expect(pool).to_have_class(re.compile(r"(^|\s)stale(\s|$)"))
    await expect(pool.locator(".live-age")).to_have_text(
        re.compile(r"last updated \d+ s ago"), timeout=3000
    )
    await expect(dot).not_to_have_css("background-color", GREEN)
    await expect(pool.locator(f"#backend-{name} .health-badge")).to_have_css("opacity", "0.55")
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390

    await page.unroute("**/admin/stream/**", refuse)
    await expect(state).to_have_text("Live", timeout=20_000)
    await expect(pool).not_to_have_class(re.compile(r"(^|\s)stale(\s|$)"))
    await expect(pool.locator(".live-age")).to_have_text("")
    assert await page.evaluate("window.aronaOpens") >= 1
    await expect(dot).to_have_css("background-color", GREEN)
    assert not [e for e in errors if "Content Security Policy" in e], errors


async def test_a_stream_that_goes_quiet_shows_disconnected(
    site: Site, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection stays open but nothing comes (a hung replica, a stalled proxy):
    # past two heartbeats the page must say so, and recover once events flow again.
    monkeypatch.setattr(stream, "HEARTBEAT_SECONDS", 0.5)
    released = asyncio.Event()
    original = BackendsFeed.on_tick

    async def hung(self: BackendsFeed) -> list[tuple[str, str]]:
        await released.wait()
        return await original(self)

    monkeypatch.setattr(BackendsFeed, "on_tick", hung)
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin/backends")
    pool = page.locator('[sse-connect="/admin/stream/backends"]')
    state = pool.locator(".live-state")
    await expect(state).to_have_text("Live")
    await expect(state).to_have_text("Disconnected", timeout=8000)
    await expect(pool).to_have_class(re.compile(r"(^|\s)stale(\s|$)"))
    await expect(pool.locator(".live-dot")).not_to_have_css("background-color", GREEN)
    released.set()
    await expect(state).to_have_text("Live", timeout=20_000)
    await expect(pool).not_to_have_class(re.compile(r"(^|\s)stale(\s|$)"))
