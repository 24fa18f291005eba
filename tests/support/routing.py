"""Fixtures and helpers for the backend and alias admin API tests.

These tests register backends, which every app started on the same database then
loads and probes; they get databases of their own (one PostgreSQL, one SQLite per
module) so the rest of the suite never sees them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.settings import Settings
from tests.support.api import Client, eventually
from tests.support.auth import fresh_database
from tests.support.helpers import bearer
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "admin-" + "t" * 40
ADMIN = bearer(ADMIN_TOKEN)
UPSTREAM_KEY = "sk-upstream-" + "s" * 24
Upstream = tuple[FakeOpenAI, str]
BACKEND_FIELDS = {
    "name",
    "type",
    "url",
    "resolved_url",
    "has_api_key",
    "models",
    "tags",
    "max_concurrency",
    "advertised_models",
    "health",
    "breaker",
    "in_flight",
    "created_at",
    "updated_at",
}


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
async def routing_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Settings]:
    async with fresh_database(request.param, tmp_path_factory.mktemp("routing")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN)


@pytest.fixture(scope="module")
async def routing_pg_settings(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("routing-pg")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN)


@pytest.fixture
async def admin_client(
    routing_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Any]]:
    async with AsyncTestClient(app=make_app(routing_settings)) as client:
        yield client


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """A real OpenAI-compatible server on a loopback port that wants ``UPSTREAM_KEY``."""
    fake = FakeOpenAI(
        "upstream", models=["gpt-4o-mini", "text-embedding-3-small"], api_key=UPSTREAM_KEY
    )
    async with serve_asgi(fake) as url:
        yield fake, url


def unique_name(tag: str = "b") -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


async def register_backend(client: Client | httpx.AsyncClient, **body: Any) -> Any:
    return await client.post("/api/admin/backends", json=body, headers=ADMIN)


async def backend(client: Client | httpx.AsyncClient, name: str) -> Any:
    return await client.get(f"/api/admin/backends/{name}", headers=ADMIN)


async def wait_healthy(client: Client | httpx.AsyncClient, name: str, within: float = 30.0) -> Any:
    """Poll until the backend's health is ``healthy``; returns its last body."""
    last: dict[str, Any] = {}

    async def healthy() -> bool:
        response = await backend(client, name)
        if response.status_code != 200:
            return False
        last.update(response.json())
        return bool(last["health"]["status"] == "healthy")

    await eventually(healthy, within=within, interval=0.02)
    return last
