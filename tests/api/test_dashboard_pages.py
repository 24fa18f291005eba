"""The admin dashboard over HTTP: who may see it, its forms, and its SSE streams.

A live server (uvicorn in the test's event loop, PostgreSQL + Redis, a database of
its own since these tests register backends) driven by plain httpx clients carrying
a browser session cookie, so the streams run exactly as a browser sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from app.cli.bootstrap import create_admin
from app.db.models import BackendConfig, Conversation, FallbackPin, Project, UsageRecord, User
from app.domain.dashboard.stream import SentCache, encode, feed_events, ping_frame
from app.lib.events.base import Event
from app.lib.events.memory import MemoryEventBus
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.routing.health import HEALTH_CHANNEL
from app.server.resources import Resources
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.helpers import PASSWORD, bearer, console_login, unique_email
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "admin-" + "d" * 40
ADMIN_API = bearer(ADMIN_TOKEN)
HTMX = {"HX-Request": "true"}
MISSING = "00000000-0000-4000-8000-000000000000"
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')

PAGES = [
    "/admin",
    "/admin/backends",
    "/admin/backend-rows",
    "/admin/backend-form?type=vllm",
    "/admin/backends/some-backend/edit",
    "/admin/aliases",
    "/admin/profiles",
    "/admin/profile-rows",
    "/admin/profile-form",
    "/admin/profiles/some-profile/edit",
    "/admin/failover",
    "/admin/projects",
    f"/admin/projects/{MISSING}/row",
    f"/admin/projects/{MISSING}/quota",
    "/admin/usage",
    "/admin/budgets",
    "/admin/stream/backends",
    "/admin/stream/failover",
    "/admin/stream/budgets",
]
WRITES = [
    ("POST", "/admin/backends"),
    ("POST", "/admin/backends/some-backend"),
    ("DELETE", "/admin/backends/some-backend"),
    ("POST", "/admin/backends/some-backend/probe"),
    ("POST", "/admin/aliases"),
    ("DELETE", "/admin/aliases/some-alias"),
    ("POST", "/admin/profiles"),
    ("POST", "/admin/profiles/some-profile"),
    ("DELETE", "/admin/profiles/some-profile"),
    ("POST", "/admin/failover/switch"),
    ("DELETE", f"/admin/pins/{MISSING}"),
    ("POST", f"/admin/projects/{MISSING}/quota"),
]


@dataclass
class Live:
    url: str
    resources: Resources
    anonymous: httpx.AsyncClient
    api: httpx.AsyncClient
    """Bearer-authenticated with the operator's admin token (the JSON admin API)."""


@dataclass
class Browser:
    """A client with a console session, as a browser would send its requests."""

    http: httpx.AsyncClient
    csrf: str

    def headers(self, htmx: bool = True) -> dict[str, str]:
        return {"X-CSRF-Token": self.csrf, **(HTMX if htmx else {})}


@pytest.fixture(scope="module")
async def dashboard_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("dashboard")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN, health_interval_seconds=0.5)


@pytest.fixture
async def live(dashboard_settings: Settings, make_app: AppFactory) -> AsyncIterator[Live]:
    app = make_app(dashboard_settings)
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(live_server(app))
        anonymous = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        api = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, timeout=30, headers=ADMIN_API)
        )
        yield Live(url=url, resources=app.state.resources, anonymous=anonymous, api=api)


async def _session(live: Live, email: str, password: str) -> Browser:
    http = httpx.AsyncClient(base_url=live.url, timeout=30)
    response = await console_login(http, email, password)
    assert response.status_code == 303, response.text
    http.cookies.set("arona_session", response.cookies["arona_session"])
    page = await http.get("/projects")
    found = CSRF.search(page.text)
    assert found, page.text
    return Browser(http=http, csrf=found.group(1))


@pytest.fixture
async def admin(live: Live, fast_hasher: PasswordHasher) -> AsyncIterator[Browser]:
    email = unique_email("dash-admin")
    await create_admin(live.resources.db_config, fast_hasher, email=email, password=PASSWORD)
    browser = await _session(live, email, PASSWORD)
    yield browser
    await browser.http.aclose()


@pytest.fixture
async def member(live: Live) -> AsyncIterator[Browser]:
    email = unique_email("dash-member")
    response = await live.anonymous.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD}
    )
    assert response.status_code == 201, response.text
    # The first account of a fresh database becomes an admin: make sure this one is not.
    async with live.resources.db_config.get_session() as session:
        await session.execute(update(User).where(User.email == email).values(is_admin=False))
        await session.commit()
    browser = await _session(live, email, PASSWORD)
    yield browser
    await browser.http.aclose()


def _name(tag: str = "dash") -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------- who may see it


async def test_logged_out_visitors_are_sent_to_the_login_page(live: Live) -> None:
    for path in PAGES:
        response = await live.anonymous.get(path)
        assert response.status_code in (302, 303), (path, response.status_code)
        assert response.headers["location"].startswith("/login?next="), path
    for method, path in WRITES:
        response = await live.anonymous.request(method, path)
        assert response.status_code in (302, 303), (method, path, response.status_code)
        assert response.headers["location"].startswith("/login?next="), path
    htmx = await live.anonymous.get("/admin/backend-rows", headers=HTMX)
    assert htmx.headers["hx-redirect"].startswith("/login?next=")


async def test_a_user_who_is_not_a_platform_admin_gets_403_everywhere(
    live: Live, member: Browser
) -> None:
    for path in PAGES:
        response = await member.http.get(path)
        assert response.status_code == 403, (path, response.status_code)
        assert "text/event-stream" not in response.headers["content-type"], path
    for method, path in WRITES:
        response = await member.http.request(method, path, headers=member.headers())
        assert response.status_code == 403, (method, path, response.status_code)
        assert "toast" in response.headers["hx-trigger"], path
    assert "/admin" not in (await member.http.get("/projects")).text  # no Dashboard link


async def test_unsafe_requests_without_the_csrf_token_are_refused(
    live: Live, admin: Browser
) -> None:
    alias = _name("alias")
    refused = await admin.http.post(
        "/admin/aliases", data={"alias": alias, "target": "qwen3-8b"}, headers=HTMX
    )
    assert refused.status_code == 403
    forged = await admin.http.post(
        "/admin/aliases",
        data={"alias": alias, "target": "qwen3-8b", "csrf_token": "not-the-token"},
    )
    assert forged.status_code == 403
    switch = await admin.http.post("/admin/failover/switch", data={"enabled": "off"})
    assert switch.status_code == 403
    assert live.resources.failover_control.policy.enabled is True
    listed = await live.api.get("/api/admin/aliases")
    assert alias not in listed.text
    # The same post with the token goes through (the form field works like the header).
    accepted = await admin.http.post(
        "/admin/aliases",
        data={"alias": alias, "target": "qwen3-8b", "csrf_token": admin.csrf},
        headers=HTMX,
    )
    assert accepted.status_code == 200, accepted.text
    assert alias in (await live.api.get("/api/admin/aliases")).text


async def test_every_admin_page_renders_for_an_admin(live: Live, admin: Browser) -> None:
    for path in PAGES:
        if "/stream/" in path or MISSING in path or "some-" in path:
            continue
        response = await admin.http.get(path)
        assert response.status_code == 200, (path, response.text)
        assert "style=" not in response.text, path  # the CSP allows no inline style
        assert "<script>" not in response.text, path
    overview = await admin.http.get("/admin")
    assert 'aria-current="page">Dashboard' in overview.text


# --------------------------------------------------------------------- forms


async def test_backend_forms_validate_and_never_show_keys(live: Live, admin: Browser) -> None:
    form = await admin.http.get("/admin/backend-form?type=comfyui", headers=HTMX)
    assert "comfyui backend removed" in form.text
    assert "<form" not in form.text

    comfy = {"type": "comfyui", "name": _name(), "url": "http://127.0.0.1:8188"}
    refused = await admin.http.post("/admin/backends", data=comfy, headers=admin.headers())
    assert refused.status_code == 200  # swapped into the page by HTMX
    assert "comfyui backend removed" in refused.text
    plain = await admin.http.post("/admin/backends", data=comfy, headers=admin.headers(False))
    assert plain.status_code == 400
    assert "comfyui backend removed" in plain.text

    empty = await admin.http.post("/admin/backends", data={"type": "vllm"}, headers=admin.headers())
    assert 'id="backend-name-error"' in empty.text
    assert 'id="backend-url-error"' in empty.text
    bad = await admin.http.post(
        "/admin/backends",
        data={"type": "external", "name": "has space", "url": "ftp://x"},
        headers=admin.headers(),
    )
    assert "1-100 letters" in bad.text or "must start with http" in bad.text

    name, secret = _name("vllm"), "sk-dashboard-" + "k" * 20
    created = await admin.http.post(
        "/admin/backends",
        data={
            "type": "vllm",
            "name": name,
            "url": "http://127.0.0.1:9",
            "api_key": secret,
            "models": "qwen3-8b, llama-3.1-8b",
            "tags": "gpu",
        },
        headers=admin.headers(),
    )
    assert created.status_code == 200, created.text
    assert "backends-changed" in created.headers["hx-trigger"]
    assert "registered" in created.headers["hx-trigger"]
    again = await admin.http.post(
        "/admin/backends",
        data={"type": "vllm", "name": name, "url": "http://127.0.0.1:9"},
        headers=admin.headers(),
    )
    assert "exists" in again.text

    rows = await admin.http.get("/admin/backend-rows", headers=HTMX)
    assert f'id="backend-{name}"' in rows.text
    assert "qwen3-8b" in rows.text
    edit = await admin.http.get(f"/admin/backends/{name}/edit", headers=HTMX)
    assert "leave blank to keep it" in edit.text
    for text in (rows.text, edit.text, (await admin.http.get("/admin/backends")).text):
        assert secret not in text

    # Saving without a key keeps the stored one; the URL changes.
    saved = await admin.http.post(
        f"/admin/backends/{name}",
        data={"url": "http://127.0.0.1:10", "models": "qwen3-8b"},
        headers=admin.headers(),
    )
    assert saved.status_code == 200, saved.text
    stored = (await live.api.get(f"/api/admin/backends/{name}")).json()
    assert stored["has_api_key"] is True
    assert stored["url"] == "http://127.0.0.1:10"
    assert stored["models"] == ["qwen3-8b"]

    probed = await admin.http.post(f"/admin/backends/{name}/probe", headers=admin.headers())
    assert probed.status_code == 200
    assert f'id="backend-{name}"' in probed.text
    assert "health-badge bad" in probed.text
    assert "unhealthy" in probed.headers["hx-trigger"]

    removed = await admin.http.delete(f"/admin/backends/{name}", headers=admin.headers())
    assert removed.status_code == 200
    assert removed.text == ""
    assert (await live.api.get(f"/api/admin/backends/{name}")).status_code == 404


async def test_the_backend_form_sets_changes_and_clears_max_concurrency(
    live: Live, admin: Browser
) -> None:
    form = await admin.http.get("/admin/backend-form?type=vllm", headers=HTMX)
    assert 'name="max_concurrency"' in form.text
    name = _name("slots")
    body = {"type": "vllm", "name": name, "url": "http://127.0.0.1:9"}
    refusals = (("0", "at least 1"), ("100001", "no larger than 100,000"), ("many", "whole number"))
    for bad, message in refusals:
        refused = await admin.http.post(
            "/admin/backends", data={**body, "max_concurrency": bad}, headers=admin.headers()
        )
        assert 'id="backend-max-concurrency-error"' in refused.text, (bad, refused.text)
        assert message in refused.text
        assert (await live.api.get(f"/api/admin/backends/{name}")).status_code == 404

    created = await admin.http.post(
        "/admin/backends", data={**body, "max_concurrency": "32"}, headers=admin.headers()
    )
    assert "registered" in created.headers["hx-trigger"], created.text
    assert (await live.api.get(f"/api/admin/backends/{name}")).json()["max_concurrency"] == 32
    state = live.resources.backend_registry.get(name)
    assert state is not None
    assert state.spec.max_concurrency == 32
    rows = await admin.http.get("/admin/backend-rows", headers=HTMX)
    assert "Max concurrency: 32" in rows.text
    edit = await admin.http.get(f"/admin/backends/{name}/edit", headers=HTMX)
    assert re.search(r'name="max_concurrency" type="text" value="32"', edit.text), edit.text

    for typed, expected in (("1_000", 1000), ("", None)):
        saved = await admin.http.post(
            f"/admin/backends/{name}",
            data={"url": "http://127.0.0.1:9", "max_concurrency": typed},
            headers=admin.headers(),
        )
        assert "saved" in saved.headers["hx-trigger"], saved.text
        shown = (await live.api.get(f"/api/admin/backends/{name}")).json()
        assert shown["max_concurrency"] == expected
        state = live.resources.backend_registry.get(name)
        assert state is not None
        assert state.spec.max_concurrency == expected
    await live.api.delete(f"/api/admin/backends/{name}")


async def test_the_profile_form_sets_changes_and_clears_the_routing_score(
    live: Live, admin: Browser
) -> None:
    form = await admin.http.get("/admin/profile-form", headers=HTMX)
    assert 'name="routing_score"' in form.text
    assert '<option value="capacity">' in form.text
    assert '<option value="seed">' in form.text
    profile_id = _name("scored")
    body = {"id": profile_id, "name": "Scored", "base_model": "gpt-4o-mini", "enabled": "on"}
    bogus = await admin.http.post(
        "/admin/profiles", data={**body, "routing_score": "fastest"}, headers=admin.headers()
    )
    assert 'id="profile-score-error"' in bogus.text, bogus.text
    assert live.resources.profile_table.get(profile_id) is None

    created = await admin.http.post(
        "/admin/profiles", data={**body, "routing_score": "seed"}, headers=admin.headers()
    )
    assert "profiles-changed" in created.headers.get("hx-trigger", ""), created.text
    stored = live.resources.profile_table.get(profile_id)
    assert stored is not None
    assert stored.routing_score == "seed"
    rows = await admin.http.get("/admin/profile-rows", headers=HTMX)
    assert "seed score" in rows.text
    edit = await admin.http.get(f"/admin/profiles/{profile_id}/edit", headers=HTMX)
    assert '<option value="seed" selected>' in edit.text

    for typed, expected in (("capacity", "capacity"), ("", None)):
        saved = await admin.http.post(
            f"/admin/profiles/{profile_id}",
            data={**body, "routing_score": typed},
            headers=admin.headers(),
        )
        assert "profiles-changed" in saved.headers.get("hx-trigger", ""), saved.text
        stored = live.resources.profile_table.get(profile_id)
        assert stored is not None
        assert stored.routing_score == expected
    await admin.http.delete(f"/admin/profiles/{profile_id}", headers=admin.headers())


async def test_alias_profile_and_quota_forms(live: Live, admin: Browser) -> None:
    alias = f"org/{_name('alias')}"
    same = await admin.http.post(
        "/admin/aliases", data={"alias": alias, "target": alias}, headers=admin.headers()
    )
    assert "cannot point to itself" in same.text
    added = await admin.http.post(
        "/admin/aliases", data={"alias": alias, "target": "qwen3-8b"}, headers=admin.headers()
    )
    assert added.status_code == 200
    assert alias in added.text
    assert live.resources.alias_table.resolve(alias) == "qwen3-8b"
    gone = await admin.http.delete(f"/admin/aliases/{alias}", headers=admin.headers())
    assert gone.status_code == 200
    assert live.resources.alias_table.resolve(alias) == alias

    fast, slow = _name("fast"), _name("slow")
    missing = await admin.http.post(
        "/admin/profiles", data={"id": fast, "enabled": "on"}, headers=admin.headers()
    )
    assert 'id="profile-name-error"' in missing.text
    for profile_id in (fast, slow):
        body = {
            "id": profile_id,
            "name": profile_id.title(),
            "base_model": "gpt-4o-mini",
            "enabled": "on",
            "context_window_tokens": "8192",
            "max_output_tokens": "1024",
        }
        if profile_id == slow:
            body |= {"slow_threshold_ms": "250", "failover_chain": f"{fast}, nope-{fast}"}
        response = await admin.http.post("/admin/profiles", data=body, headers=admin.headers())
        if profile_id == slow:
            assert 'id="profile-chain-error"' in response.text, response.text
            assert "no model profile" in response.text
            body["failover_chain"] = fast
            response = await admin.http.post("/admin/profiles", data=body, headers=admin.headers())
        assert "profiles-changed" in response.headers.get("hx-trigger", ""), response.text
    stored = live.resources.profile_table.get(slow)
    assert stored is not None
    assert stored.failover_chain == (fast,)
    not_a_number = await admin.http.post(
        f"/admin/profiles/{slow}",
        data={"name": "Slow", "base_model": "gpt-4o-mini", "slow_threshold_ms": "soon"},
        headers=admin.headers(),
    )
    assert 'id="profile-slow-error"' in not_a_number.text
    assert "Enter a whole number." in not_a_number.text
    in_use = await admin.http.delete(f"/admin/profiles/{fast}", headers=admin.headers())
    assert in_use.status_code == 409
    assert "failover chain" in in_use.headers["hx-trigger"]

    project = await _project(live)
    bad = await admin.http.post(
        f"/admin/projects/{project}/quota", data={"per_minute": "lots"}, headers=admin.headers()
    )
    assert f'id="quota-minute-{project}-error"' in bad.text
    assert "Enter a whole number." in bad.text
    saved = await admin.http.post(
        f"/admin/projects/{project}/quota",
        data={"per_minute": "60", "per_day": "", "per_month": "100000", "fail_closed": "on"},
        headers=admin.headers(),
    )
    assert saved.status_code == 200
    assert f'id="project-{project}"' in saved.text
    assert "100,000" in saved.text
    quota = (await live.api.get(f"/api/projects/{project}/quota")).json()
    ceilings = {k: quota["adminLimits"][k] for k in ("perMinute", "perDay", "perMonth")}
    assert ceilings == {"perMinute": 60, "perDay": None, "perMonth": 100000}
    assert quota["failClosed"] is True


async def _project(live: Live) -> str:
    email = unique_email("owner")
    await live.anonymous.post("/api/auth/register", json={"email": email, "password": PASSWORD})
    tokens = (
        await live.anonymous.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    ).json()
    created = await live.anonymous.post(
        "/api/projects",
        json={"name": "Dash project", "slug": _name("p")},
        headers=bearer(tokens["accessToken"]),
    )
    assert created.status_code == 201, created.text
    project_id: str = created.json()["id"]
    return project_id


async def test_failover_switch_and_clearing_a_pin(live: Live, admin: Browser) -> None:
    off = await admin.http.post(
        "/admin/failover/switch", data={"enabled": "off"}, headers=admin.headers()
    )
    assert off.status_code == 200
    assert "Turn failover on" in off.text
    assert live.resources.failover_control.policy.enabled is False
    on = await admin.http.post(
        "/admin/failover/switch", data={"enabled": "on"}, headers=admin.headers()
    )
    assert "Turn failover off" in on.text
    assert live.resources.failover_control.policy.enabled is True

    conversation = await _pinned_conversation(live)
    page = await admin.http.get("/admin/failover")
    assert f'id="pin-{conversation}"' in page.text
    cleared = await admin.http.delete(f"/admin/pins/{conversation}", headers=admin.headers())
    assert cleared.status_code == 200
    assert cleared.text == ""
    assert f'id="pin-{conversation}"' not in (await admin.http.get("/admin/failover")).text
    twice = await admin.http.delete(f"/admin/pins/{conversation}", headers=admin.headers())
    assert twice.status_code == 404


async def _pinned_conversation(live: Live) -> uuid.UUID:
    project_id = uuid.UUID(await _project(live))
    conversation_id = uuid.uuid4()
    async with live.resources.db_config.get_session() as session:
        assert await session.get(Project, project_id) is not None
        session.add(Conversation(id=conversation_id, project_id=project_id, title="pinned"))
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
    return conversation_id


# ------------------------------------------------------------------- streams


class _Frames:
    """Reads SSE frames off a streamed httpx response."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._buffer = ""
        self.comments = 0

    async def next(self, within: float = 5.0) -> tuple[str | None, str]:
        async with asyncio.timeout(within):
            while "\n\n" not in self._buffer:
                self._buffer += await anext(self._chunks)
        block, self._buffer = self._buffer.split("\n\n", 1)
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line.startswith(":"):
                self.comments += 1
        return name, "\n".join(data)

    async def until(self, name: str, within: float = 5.0, containing: str = "") -> str:
        deadline = time.monotonic() + within
        while True:
            got, data = await self.next(max(0.1, deadline - time.monotonic()))
            if got == name and containing in data:
                return data


async def _subscribers(live: Live, channel: str) -> int:
    redis = live.resources.redis
    assert redis is not None
    prefix = live.resources.settings.redis_prefix
    [(_, count)] = await redis.pubsub_numsub(f"{prefix}events:{channel}")
    return int(count)


async def test_the_backends_stream_sends_a_health_change_and_ends_its_subscription(
    live: Live, admin: Browser
) -> None:
    name = _name("down")
    registered = await live.api.post(
        "/api/admin/backends", json={"name": name, "type": "external", "url": "http://127.0.0.1:9"}
    )
    assert registered.status_code == 201, registered.text
    before = await _subscribers(live, HEALTH_CHANNEL)

    async with admin.http.stream("GET", "/admin/stream/backends") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        frames = _Frames(response)
        table = await frames.until("backends")  # the snapshot, before anything happens
        assert f'id="backend-{name}"' in table
        assert f'sse-swap="backend-{name}-health"' in table
        assert await _subscribers(live, HEALTH_CHANNEL) == before + 1
        # An open stream holds no database connection (its reads use short sessions).
        pool: Any = live.resources.db_config.get_engine().pool

        async def idle() -> bool:
            return int(pool.checkedout()) == 0

        await eventually(idle, within=5.0, interval=0.05)

        # Another replica saw the backend recover: its event alone changes the row.
        await live.resources.event_bus.publish(
            HEALTH_CHANNEL,
            {
                "backend": name,
                "kind": "external",
                "status": "healthy",
                "previous": "unhealthy",
                "reason": "ok",
                "checked_at": time.time() + 30,
            },
        )
        # (Cells also come on the timer; only the event can make this one healthy.)
        cell = await frames.until(f"backend-{name}-health", containing="health-badge ok")
        assert cell.startswith('<span class="badge status health-badge ok">healthy</span>')

    async def unsubscribed() -> bool:
        return await _subscribers(live, HEALTH_CHANNEL) == before

    await eventually(unsubscribed, within=5.0, interval=0.05)


async def test_the_failover_stream_follows_the_switch(live: Live, admin: Browser) -> None:
    before = await _subscribers(live, "failover")
    async with admin.http.stream("GET", "/admin/stream/failover") as response:
        frames = _Frames(response)
        switch = await frames.until("failover-switch")
        assert "Turn failover off" in switch
        await frames.until("pins")
        turned = await admin.http.post(
            "/admin/failover/switch", data={"enabled": "off"}, headers=admin.headers()
        )
        assert turned.status_code == 200
        assert "Turn failover on" in await frames.until("failover-switch")
        await admin.http.post(
            "/admin/failover/switch", data={"enabled": "on"}, headers=admin.headers()
        )
        assert "Turn failover off" in await frames.until("failover-switch")

    async def unsubscribed() -> bool:
        return await _subscribers(live, "failover") == before

    await eventually(unsubscribed, within=5.0, interval=0.05)


async def test_a_stream_reconnects_cleanly_after_a_drop(live: Live, admin: Browser) -> None:
    before = await _subscribers(live, HEALTH_CHANNEL)
    for _ in range(3):  # what the browser does after each drop: a fresh GET, a snapshot
        async with admin.http.stream("GET", "/admin/stream/backends") as response:
            assert "retry: " in await anext(response.aiter_text())

    async def unsubscribed() -> bool:
        return await _subscribers(live, HEALTH_CHANNEL) == before

    await eventually(unsubscribed, within=5.0, interval=0.05)


# --------------------------------------------------------- the stream, unit by unit


class _CountingFeed:
    channels: tuple[str, ...] = ("test.dashboard",)
    tick_seconds = 0.05

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.sent = SentCache()
        self.value = "a"

    async def snapshot(self) -> list[tuple[str, str]]:
        return [("thing", f"<p>{self.value}</p>")]

    async def on_event(self, event: Event) -> list[tuple[str, str]]:
        self.events.append(event)
        return [("thing", "<p>event</p>\n<p>two lines</p>")]

    async def on_tick(self) -> list[tuple[str, str]]:
        return self.sent.changed([("thing", f"<p>{self.value}</p>")])


async def test_feed_events_heartbeats_dedupes_and_unsubscribes_on_close() -> None:
    bus = MemoryEventBus()
    feed = _CountingFeed()
    stream = feed_events(bus, feed, heartbeat=0.1, max_seconds=30)
    first = await anext(stream)
    assert first.startswith(b"retry: ")
    assert b"event: thing\ndata: <p>a</p>\n\n" in first
    assert "test.dashboard" in bus._subscribers  # subscribed before the first byte

    # Ticks send only what changed: the first tick sends "a" (never sent by a tick),
    # then silence but for the heartbeat (its interval in milliseconds).
    assert first.endswith(b"event: ping\ndata: 100\n\n")
    assert await anext(stream) == encode([("thing", "<p>a</p>")])
    assert await asyncio.wait_for(anext(stream), 1.0) == ping_frame(0.1)
    feed.value = "b"
    assert await asyncio.wait_for(anext(stream), 1.0) == encode([("thing", "<p>b</p>")])

    await bus.publish("test.dashboard", {"x": 1})
    sent = await asyncio.wait_for(anext(stream), 1.0)
    assert sent == b"event: thing\ndata: <p>event</p>\ndata: <p>two lines</p>\n\n"
    assert feed.events == [{"x": 1, "channel": "test.dashboard"}]

    await stream.aclose()  # what send_event_stream does when the client leaves
    assert bus._subscribers == {}


async def test_feed_events_ends_after_its_lifetime_and_when_the_bus_closes() -> None:
    bus = MemoryEventBus()
    short = feed_events(bus, _CountingFeed(), heartbeat=10, max_seconds=0.2)
    chunks = [chunk async for chunk in short]
    assert chunks[0].startswith(b"retry: ")
    assert bus._subscribers == {}

    stream = feed_events(bus, _CountingFeed(), heartbeat=10, max_seconds=30)
    await anext(stream)
    await bus.close()
    rest = [chunk async for chunk in stream]  # ends: the browser reconnects
    assert all(not chunk.startswith(b"retry") for chunk in rest)


def test_event_names_are_checked() -> None:
    with pytest.raises(ValueError, match="event name"):
        encode([("bad\nname", "<p></p>")])


async def test_stored_rows_of_a_replica_that_cannot_load_them_still_show(
    live: Live, admin: Browser
) -> None:
    """A stored backend absent from this replica's registry (its key unreadable here)
    is listed as not loaded rather than hidden."""
    name = _name("ghost")
    async with live.resources.db_config.get_session() as session:
        session.add(BackendConfig(name=name, kind="external", url="http://127.0.0.1:9", models=[]))
        await session.commit()
    rows = await admin.http.get("/admin/backend-rows", headers=HTMX)
    assert f'id="backend-{name}"' in rows.text
    assert "not loaded on this replica" in rows.text
    await live.api.delete(f"/api/admin/backends/{name}")


# ------------------------------------------------------ the embedded default (SQLite)


@pytest.fixture(scope="module")
async def sqlite_dashboard_settings(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Settings]:
    async with fresh_database("sqlite", tmp_path_factory.mktemp("dashboard-sqlite")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN)


async def test_the_dashboard_on_sqlite_and_the_in_process_bus(
    sqlite_dashboard_settings: Settings, make_app: AppFactory, fast_hasher: PasswordHasher
) -> None:
    app = make_app(sqlite_dashboard_settings)
    resources: Resources = app.state.resources
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as anonymous:
        live = Live(url=url, resources=resources, anonymous=anonymous, api=anonymous)
        email = unique_email("sqlite-admin")
        await create_admin(resources.db_config, fast_hasher, email=email, password=PASSWORD)
        admin = await _session(live, email, PASSWORD)
        try:
            project_id = uuid.UUID(await _project(live))
            async with resources.db_config.get_session() as session:
                session.add(
                    UsageRecord(
                        project_id=project_id,
                        model_requested="qwen3-8b",
                        backend="vllm-a",
                        endpoint="chat",
                        status=200,
                        total_tokens=42,
                    )
                )
                await session.commit()
            for path in PAGES:
                if "/stream/" in path or MISSING in path or "some-" in path:
                    continue
                response = await admin.http.get(path)
                assert response.status_code == 200, (path, response.text)
            usage = await admin.http.get("/admin/usage?period=24h")
            assert "Dash project" in usage.text
            assert "<svg" in usage.text
            bus: Any = resources.event_bus  # MemoryEventBus: subscribers by channel

            def subscribers() -> int:
                return len(bus._subscribers.get("failover", ()))

            before = subscribers()
            async with admin.http.stream("GET", "/admin/stream/failover") as response:
                await _Frames(response).until("failover-switch")
                assert subscribers() == before + 1

            async def unsubscribed() -> bool:
                return subscribers() == before

            await eventually(unsubscribed, within=5.0, interval=0.05)
        finally:
            await admin.http.aclose()
