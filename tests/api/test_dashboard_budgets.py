"""The dashboard's budgets page over HTTP: alerts published on the app's own EventBus
(as ``BudgetAlerts`` publishes them) show on the page and arrive live on its stream,
with project and key names, newest first, per project with ``?project=``; only
platform admins see them. A live server on PostgreSQL + Redis; httpx clients carry a
browser session cookie, as a browser would."""

from __future__ import annotations

import contextlib
import datetime
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from app.cli.bootstrap import create_admin
from app.db.models import User
from app.domain.quotas.alerts import CHANNEL, BudgetAlert
from app.lib.clock import utcnow
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.server.resources import Resources
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.helpers import PASSWORD, bearer, console_login, unique_email
from tests.support.live_server import live_server
from tests.support.settings import AppFactory
from tests.support.sse_frames import SseFrames

CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')


@dataclass
class Live:
    url: str
    resources: Resources
    http: httpx.AsyncClient
    """Anonymous."""

    async def publish(self, alert: BudgetAlert) -> None:
        await self.resources.event_bus.publish(CHANNEL, alert.event("another-replica"))


@dataclass
class Tenant:
    project_id: uuid.UUID
    name: str
    key_id: uuid.UUID


@pytest.fixture(scope="module")
async def budgets_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("budgets")) as settings:
        yield settings


@pytest.fixture
async def live(budgets_settings: Settings, make_app: AppFactory) -> AsyncIterator[Live]:
    app = make_app(budgets_settings)
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(live_server(app))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield Live(url, app.state.resources, http)


async def _session(live: Live, email: str) -> httpx.AsyncClient:
    http = httpx.AsyncClient(base_url=live.url, timeout=30)
    response = await console_login(http, email, PASSWORD)
    assert response.status_code == 303, response.text
    http.cookies.set("arona_session", response.cookies["arona_session"])
    assert CSRF.search((await http.get("/projects")).text)
    return http


@pytest.fixture
async def admin(live: Live, fast_hasher: PasswordHasher) -> AsyncIterator[httpx.AsyncClient]:
    email = unique_email("budget-admin")
    await create_admin(live.resources.db_config, fast_hasher, email=email, password=PASSWORD)
    http = await _session(live, email)
    yield http
    await http.aclose()


async def _owner(live: Live) -> tuple[str, dict[str, str]]:
    email = unique_email("budget-owner")
    registered = await live.http.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD}
    )
    assert registered.status_code == 201, registered.text
    # The first account of a fresh database becomes an admin: make sure this one is not.
    async with live.resources.db_config.get_session() as session:
        await session.execute(update(User).where(User.email == email).values(is_admin=False))
        await session.commit()
    tokens = await live.http.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    return email, bearer(tokens.json()["accessToken"])


async def _tenant(live: Live, name: str) -> Tenant:
    _, headers = await _owner(live)
    created = await live.http.post(
        "/api/projects", json={"name": name, "slug": f"b-{uuid.uuid4().hex[:10]}"}, headers=headers
    )
    assert created.status_code == 201, created.text
    project_id = created.json()["id"]
    key = await live.http.post(
        f"/api/projects/{project_id}/api-keys", json={"name": "ci-bot"}, headers=headers
    )
    assert key.status_code == 201, key.text
    return Tenant(uuid.UUID(project_id), name, uuid.UUID(key.json()["id"]))


def _alert(tenant: Tenant, threshold: int, **fields: Any) -> BudgetAlert:
    now = utcnow()
    values: dict[str, Any] = {
        "alert_id": f"{{{tenant.project_id}}}:c:d:{uuid.uuid4().hex[:6]}|alert:{threshold}",
        "project_id": tenant.project_id,
        "credential_id": None,
        "metric": "cost",
        "window": "day",
        "threshold": threshold,
        "used": 8_000_000,
        "limit": 10_000_000,
        "currency": "USD",
        "resets_at": now + datetime.timedelta(hours=5, minutes=30),
        "at": now,
    }
    return BudgetAlert(**{**values, **fields})


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr class="budget-alert.*?</tr>', html, re.S)


async def test_alerts_show_on_the_page_and_arrive_live_newest_first(
    live: Live, admin: httpx.AsyncClient
) -> None:
    tenant = await _tenant(live, f"Budget Co {uuid.uuid4().hex[:4]}")
    other = await _tenant(live, f"Other Co {uuid.uuid4().hex[:4]}")
    page = await admin.get("/admin/budgets")
    assert page.status_code == 200, page.text
    assert 'aria-current="page">Budgets' in page.text
    assert 'sse-connect="/admin/stream/budgets"' in page.text
    assert "style=" not in page.text  # the CSP allows no inline style
    assert "<script>" not in page.text

    async with admin.stream("GET", "/admin/stream/budgets") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = SseFrames(response)
        snapshot = await frames.until("budget-alerts")
        assert tenant.name not in snapshot

        # Raised on another replica: the bus brings it to this page.
        await live.publish(_alert(tenant, 80))
        rows = await frames.until("budget-alerts", tenant.name)
        [row] = [r for r in _rows(rows) if tenant.name in r]
        assert 'class="budget-alert warn"' in row
        assert "80 % · warning" in row
        assert "spend per day" in row
        assert "8 USD / 10 USD" in row
        assert ">project<" in row
        assert f'href="/admin/budgets?project={tenant.project_id}"' in row
        assert "just now" in row
        assert "in 5 h" in row  # resets in 5 h 30 min

        key_alert = _alert(
            tenant,
            100,
            credential_id=tenant.key_id,
            metric="tokens",
            window="month",
            used=1_200_000,
            limit=1_000_000,
            currency=None,
        )
        await live.publish(key_alert)
        rows = await frames.until("budget-alerts", "API key ci-bot")
        mine = [r for r in _rows(rows) if tenant.name in r]
        assert len(mine) == 2
        assert "100 % · reached" in mine[0]  # the newest first
        assert 'class="budget-alert bad"' in mine[0]
        assert "tokens per month" in mine[0]
        assert "1,200,000 / 1,000,000" in mine[0]
        assert "120 % used" in mine[0]
        assert "80 % · warning" in mine[1]

        # The same alert heard twice (each replica hears each one) is shown once.
        await live.publish(key_alert)
        await live.publish(_alert(other, 80))
        rows = await frames.until("budget-alerts", other.name)
        assert sum("API key ci-bot" in r for r in _rows(rows)) == 1

    # Recorded once in the history the replicas share.
    log = live.resources.budget_alert_log
    assert log.shared is not None

    async def recorded() -> bool:
        return len(await log.shared.recent()) >= 3  # type: ignore[union-attr]

    await eventually(recorded, within=5.0)
    assert len([e for e in await log.shared.recent() if e.project_id == tenant.project_id]) == 2

    # After a reload the page has them too, from the shared record.
    listed = _rows((await admin.get("/admin/budgets")).text)
    assert "API key ci-bot" in listed[0] or other.name in listed[0]
    assert any(other.name in r for r in listed)

    # One project's alerts: its page and its stream leave the others out.
    only = await admin.get(f"/admin/budgets?project={tenant.project_id}")
    assert only.status_code == 200
    assert f"Alerts of {tenant.name}" in only.text
    assert f'sse-connect="/admin/stream/budgets?project={tenant.project_id}"' in only.text
    assert len(_rows(only.text)) == 2
    assert other.name not in only.text
    async with admin.stream("GET", f"/admin/stream/budgets?project={other.project_id}") as one:
        snapshot = await SseFrames(one).until("budget-alerts")
        assert other.name in snapshot
        assert tenant.name not in snapshot

    # The projects page links each project to its alerts.
    projects = await admin.get("/admin/projects")
    assert f'href="/admin/budgets?project={tenant.project_id}"' in projects.text


async def test_a_project_without_alerts_and_a_bad_filter(
    live: Live, admin: httpx.AsyncClient
) -> None:
    quiet = await _tenant(live, f"Quiet Co {uuid.uuid4().hex[:4]}")
    page = await admin.get(f"/admin/budgets?project={quiet.project_id}")
    assert page.status_code == 200
    assert f"Alerts of {quiet.name}" in page.text
    assert "No budget alert for this project" in page.text
    assert (await admin.get("/admin/budgets?project=not-an-id")).status_code == 400


async def test_only_platform_admins_see_the_alerts(live: Live) -> None:
    email, _ = await _owner(live)
    member = await _session(live, email)
    try:
        for path in ("/admin/budgets", "/admin/stream/budgets"):
            refused = await member.get(path)
            assert refused.status_code == 403, path
            assert "text/event-stream" not in refused.headers["content-type"]
            anonymous = await live.http.get(path)
            assert anonymous.status_code in (302, 303), path
            assert anonymous.headers["location"].startswith("/login?next=")
        assert "/admin/budgets" not in (await member.get("/projects")).text
    finally:
        await member.aclose()
