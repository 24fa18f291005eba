"""Fixtures and helpers for the conversations and pins API tests.

Profiles are created through the model-profile admin API (so every app on the
database loads them), which needs the operator's admin token: the clients here
are built with one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from litestar.testing import AsyncTestClient

from app.db.config import build_db_config, install_sqlite_pragmas
from app.lib.settings import Settings
from tests.support.api import Client, create_api_key, create_runtime_token, settings_of
from tests.support.helpers import bearer, new_project, new_user
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "admin-" + "c" * 40
ADMIN = bearer(ADMIN_TOKEN)
RUNTIME_BASE = "/api/runtime/conversations"
CONVERSATION_FIELDS = {
    "id",
    "projectId",
    "title",
    "modelProfileId",
    "priority",
    "forkedFromId",
    "messageCount",
    "fallbackPin",
    "createdAt",
    "updatedAt",
}
MESSAGE_FIELDS = {
    "id",
    "seq",
    "role",
    "content",
    "name",
    "toolCalls",
    "toolCallId",
    "modelProfileId",
    "backend",
    "promptTokens",
    "completionTokens",
    "createdAt",
}
MISSING = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
async def pg_client(pg_settings: Settings, make_app: AppFactory) -> AsyncIterator[Client]:
    """PostgreSQL + Redis, with an admin token for the profile and pin admin APIs."""
    app = make_app(with_settings(pg_settings, admin_token=ADMIN_TOKEN))
    async with AsyncTestClient(app=app) as client:
        yield client


@pytest.fixture(params=["postgres", "sqlite"])
async def both_client(
    request: pytest.FixtureRequest,
    make_app: AppFactory,
    pg_settings: Settings,
    sqlite_settings: Settings,
) -> AsyncIterator[Client]:
    settings = pg_settings if request.param == "postgres" else sqlite_settings
    app = make_app(with_settings(settings, admin_token=ADMIN_TOKEN))
    async with AsyncTestClient(app=app) as client:
        yield client


async def make_profile(client: Client, *, enabled: bool = True, tag: str = "conv") -> str:
    profile_id = f"{tag}-{uuid.uuid4().hex[:10]}"
    response = await client.post(
        "/api/admin/model-profiles",
        json={"id": profile_id, "name": profile_id, "baseModel": "gpt-4o-mini", "enabled": enabled},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return profile_id


@dataclass
class Tenant:
    project_id: str
    owner: dict[str, str]
    runtime: dict[str, str]
    key: dict[str, str]

    @property
    def base(self) -> str:
        """The Projects API route set of this tenant."""
        return f"/api/projects/{self.project_id}/conversations"


async def new_tenant(client: Client) -> Tenant:
    _, owner = await new_user(client, "owner")
    project = await new_project(client, owner)
    token = await create_runtime_token(client, project["id"], owner)
    key = await create_api_key(client, project["id"], owner)
    return Tenant(
        project_id=project["id"],
        owner=owner,
        runtime=bearer(token["token"]),
        key=bearer(key["key"]),
    )


async def create_conversation(
    client: Client, base: str, headers: dict[str, str], **body: Any
) -> dict[str, Any]:
    response = await client.post(base, json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@asynccontextmanager
async def db_config(client: Client) -> AsyncIterator[SQLAlchemyAsyncConfig]:
    """A database config for the test's own event loop (the app runs in another)."""
    config = build_db_config(settings_of(client))
    install_sqlite_pragmas(config.get_engine())
    try:
        yield config
    finally:
        await config.get_engine().dispose()
