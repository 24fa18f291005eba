"""A limit set after traffic counts what the bucket already used: windows that start
being counted are seeded from the usage records (``app.domain.quotas.seeding``), so
the quota's ``used`` agrees with the usage the same page shows and a day limit set
after 70 calls admits none past it. On PostgreSQL + Redis."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
import pytest
from litestar import Litestar
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import UsageRecord
from app.domain.quotas.gate import QuotaGate
from app.lib.settings import Settings
from tests.api.test_quotas import _refused, admin_put, get_quota
from tests.support.conversations import ADMIN_TOKEN
from tests.support.helpers import new_project, new_user
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings

NOW = datetime.datetime.now(datetime.UTC)


def _row(project_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "project_id": uuid.UUID(project_id),
        "model_requested": "demo-chat",
        "endpoint": "chat",
        "status": 200,
        "total_tokens": 100,
        "cost_micros": 2_000,
        "created_at": NOW,
        # Every row names every column set here: an executemany takes the first
        # row's keys for all of them.
        "error_code": None,
        "is_custom": False,
        "is_override_key": False,
        **fields,
    }


async def _add_usage(settings: Settings, rows: list[dict[str, Any]]) -> None:
    engine = create_async_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(UsageRecord), rows)
    finally:
        await engine.dispose()


def _traffic(project_id: str) -> list[dict[str, Any]]:
    """Seven calls admitted today, and what must not be counted: two refused at
    admission, a custom LLM call and an override-key call, one yesterday."""
    yesterday = NOW - datetime.timedelta(days=1)
    return [
        *(_row(project_id) for _ in range(7)),
        _row(project_id, status=429, error_code="quota_exceeded", total_tokens=0),
        _row(project_id, status=403, error_code="model_not_allowed", total_tokens=0),
        _row(project_id, is_custom=True),
        _row(project_id, is_override_key=True),
        _row(project_id, created_at=yesterday),
        # Admitted, then failed upstream: counted like any admitted call.
        _row(project_id, status=502, error_code="upstream_error", total_tokens=0, cost_micros=0),
    ]


@pytest.fixture
def settings(pg_settings: Settings) -> Settings:
    return with_settings(pg_settings, admin_token=ADMIN_TOKEN)


@dataclass
class Traffic:
    """A live app whose project already has ``_traffic`` in its usage records."""

    app: Litestar
    client: httpx.AsyncClient
    project_id: str
    owner: dict[str, str]


@pytest.fixture
async def traffic(settings: Settings, make_app: AppFactory) -> AsyncIterator[Traffic]:
    app = make_app(settings)
    async with live_server(app) as url, httpx.AsyncClient(base_url=url) as client:
        _, owner = await new_user(client, "owner")  # type: ignore[arg-type]
        project = await new_project(client, owner)  # type: ignore[arg-type]
        await _add_usage(settings, _traffic(project["id"]))
        yield Traffic(app, client, project["id"], owner)


async def test_a_limit_set_after_traffic_counts_the_buckets_use(traffic: Traffic) -> None:
    client, project_id, owner = traffic.client, traffic.project_id, traffic.owner
    await admin_put(client, project_id, perDay=10)
    usage = (await get_quota(client, project_id, owner))["usage"]
    assert usage["day"]["used"] == 8  # 7 answered + 1 failed upstream
    yesterday_in_month = (NOW - datetime.timedelta(days=1)).month == NOW.month
    assert usage["month"]["used"] == 8 + (1 if yesterday_in_month else 0)
    # Token and spend windows start with their own limits, not before.
    assert usage["tokens"]["day"]["used"] is None
    # And the limit holds: two more calls fit the day's 10, the third does not.
    gate: QuotaGate = traffic.app.state.resources.quota_gate
    results = [await _refused(gate, UUID(project_id)) for _ in range(3)]
    assert results == [False, False, True]


async def test_token_and_spend_windows_are_seeded_when_their_limits_come(traffic: Traffic) -> None:
    client, project_id, owner = traffic.client, traffic.project_id, traffic.owner
    await admin_put(client, project_id, perDay=1_000)
    await admin_put(client, project_id, perDay=1_000, tokensPerDay=10_000, budgetPerDay="5")
    usage = (await get_quota(client, project_id, owner))["usage"]
    assert usage["day"]["used"] == 8  # counted since the first limit: not seeded twice
    assert usage["tokens"]["day"]["used"] == 700
    assert usage["spend"]["day"]["used"] == "0.014"


async def test_a_window_already_counted_is_not_seeded_again(traffic: Traffic) -> None:
    client, project_id, owner = traffic.client, traffic.project_id, traffic.owner
    await admin_put(client, project_id, perDay=50)
    await admin_put(client, project_id, perDay=60)
    # The owner lowering it, too, changes no window's count.
    response = await client.put(
        f"/api/projects/{project_id}/quota", json={"perDay": 40}, headers=owner
    )
    assert response.status_code == 200, response.text
    usage = (await get_quota(client, project_id, owner))["usage"]
    assert usage["day"]["used"] == 8
    # Limits removed and set again within the bucket: the window keeps its count
    # and is raised only to what the records say, never added to.
    await admin_put(client, project_id, perDay=None)
    await client.put(f"/api/projects/{project_id}/quota", json={"perDay": None}, headers=owner)
    await admin_put(client, project_id, perDay=70)
    assert (await get_quota(client, project_id, owner))["usage"]["day"]["used"] == 8
