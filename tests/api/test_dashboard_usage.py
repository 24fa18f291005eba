"""The admin dashboard's usage totals and the usage API's are one query: for the same
records (one project in a database of its own, so "every project" is that project)
the dashboard shows exactly the totals ``GET .../usage/summary`` answers, cost
included. PostgreSQL and the embedded SQLite path."""

from __future__ import annotations

import datetime
import html
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.cli.bootstrap import create_admin
from app.domain.dashboard.usage import usage_totals
from app.domain.usage.entry import UsageEntry
from app.domain.usage.writer import UsageWriter
from app.lib.clock import utcnow
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from tests.support.auth import fresh_database
from tests.support.helpers import PASSWORD, bearer, console_login, unique_email
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "admin-" + "u" * 40
STAT = re.compile(r"<dt>([^<]+)</dt><dd>([^<]*)</dd>")
SUMMED = ("requests", "promptTokens", "completionTokens", "totalTokens", "errors", "cost")


@pytest.fixture(params=["postgres", "sqlite"])
async def own_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Settings]:
    async with fresh_database(request.param, tmp_path_factory.mktemp("usage-dash")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN)


def _entries(project_id: uuid.UUID, now: datetime.datetime) -> list[UsageEntry]:
    def entry(hours_ago: float, **fields: Any) -> UsageEntry:
        base: dict[str, Any] = {
            "project_id": project_id,
            "model_requested": "gpt-a",
            "endpoint": "chat",
            "status": 200,
            "created_at": now - datetime.timedelta(hours=hours_ago),
        }
        return UsageEntry(**{**base, **fields})

    return [
        entry(
            1,
            prompt_tokens=1200,
            completion_tokens=800,
            total_tokens=2000,
            cost=0.1,
            cost_micros=100_000,
            currency="USD",
        ),
        entry(
            2,
            endpoint="video",
            cost=0.25,
            cost_micros=250_000,
            currency="USD",
            backend="minimax",
        ),
        entry(3, status=502, error_code="bad_gateway", prompt_tokens=7, total_tokens=7),
        entry(4, status=429, error_code="quota_exceeded", model_requested="gpt-b"),
        # Outside the last 24 hours: in neither answer.
        entry(48, prompt_tokens=5, total_tokens=5, cost=9.0, cost_micros=9_000_000, currency="USD"),
    ]


async def test_the_dashboard_totals_are_the_usage_api_totals(
    own_database: Settings, make_app: AppFactory, fast_hasher: PasswordHasher
) -> None:
    app = make_app(own_database)
    resources = app.state.resources
    async with (
        live_server(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as api,
        httpx.AsyncClient(base_url=url, timeout=30) as browser,
    ):
        owner = unique_email("usage-owner")
        await api.post("/api/auth/register", json={"email": owner, "password": PASSWORD})
        login = await api.post("/api/auth/login", json={"email": owner, "password": PASSWORD})
        created = await api.post(
            "/api/projects",
            json={"name": "Usage dash", "slug": f"u-{uuid.uuid4().hex[:8]}"},
            headers=bearer(login.json()["accessToken"]),
        )
        assert created.status_code == 201, created.text
        project_id = uuid.UUID(created.json()["id"])
        now = utcnow()
        writer = UsageWriter(resources.db_config.get_engine())
        for entry in _entries(project_id, now):
            writer.record(entry)
        assert await writer.flush() == 5

        since = now - datetime.timedelta(hours=24)
        summary = await api.get(
            f"/api/projects/{project_id}/usage/summary",
            params={"from": since.isoformat()},
            headers=bearer(ADMIN_TOKEN),
        )
        assert summary.status_code == 200, summary.text
        totals = summary.json()["totals"]
        assert totals == {
            "requests": 4,
            "promptTokens": 1207,
            "completionTokens": 800,
            "totalTokens": 2007,
            "errors": 2,
            "cost": 0.35,
            "costMicros": 350_000,
            "currency": "USD",
            "costEstimated": False,
        }

        async with resources.db_config.get_session() as session:
            dashboard = await usage_totals(session, since)
        assert {
            "requests": dashboard.requests,
            "promptTokens": dashboard.prompt_tokens,
            "completionTokens": dashboard.completion_tokens,
            "totalTokens": dashboard.total_tokens,
            "errors": dashboard.errors,
            "cost": dashboard.cost,
        } == {name: totals[name] for name in SUMMED}

        admin = unique_email("usage-admin")
        await create_admin(resources.db_config, fast_hasher, email=admin, password=PASSWORD)
        signed_in = await console_login(browser, admin, PASSWORD)
        assert signed_in.status_code == 303, signed_in.text
        browser.cookies.set("arona_session", signed_in.cookies["arona_session"])
        page = await browser.get("/admin/usage?period=24h")
        assert page.status_code == 200, page.text
        shown = {name: html.unescape(value) for name, value in STAT.findall(page.text)}
        assert shown == {
            "Requests": f"{totals['requests']:,}",
            "Prompt tokens": f"{totals['promptTokens']:,}",
            "Completion tokens": f"{totals['completionTokens']:,}",
            "Errors": f"{totals['errors']:,}",
            "Cost": "0.35 USD",
        }
        # The per-project table carries the cost column too.
        assert '<th scope="col">Cost</th>' in page.text
        assert '<td data-label="Cost">0.35 USD</td>' in page.text
