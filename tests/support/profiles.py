"""Fixtures and helpers for the model-profile, project-models and catalog tests.

Profiles are global (not per project), so these tests run on a PostgreSQL database
of their own per module, emptied of profiles and project settings before each test:
the rest of the suite never sees them, and each test sees only its own.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import delete, event

from app.db.models import ModelProfile, ProjectProfileSettings
from app.lib.settings import Settings
from tests.support.api import Client, create_api_key, create_runtime_token, resources_of
from tests.support.auth import execute, fresh_database
from tests.support.helpers import bearer, new_project, new_user
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "admin-" + "p" * 40
ADMIN = bearer(ADMIN_TOKEN)
BASE = "/api/admin/model-profiles"
PROFILE_FIELDS = {
    "id",
    "name",
    "baseModel",
    "tags",
    "supportsTools",
    "supportsImages",
    "contextWindowTokens",
    "maxOutputTokens",
    "enabled",
    "fallbackProfileId",
    "slowThresholdMs",
    "failoverChain",
    "routingScore",
    "createdAt",
    "updatedAt",
}
CATALOG_FIELDS = {"projectId", "defaultLlmId", "llms", "refreshedAt"}
LLM_FIELDS = {
    "id",
    "name",
    "enabled",
    "supportsTools",
    "supportsImages",
    "contextWindowTokens",
    "maxOutputTokens",
    "tags",
}
PROFILE_TABLES = ("model_profiles", "project_profile_settings")


@pytest.fixture(scope="module")
async def profiles_database(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("profiles")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN)


@pytest.fixture
async def profiles_settings(profiles_database: Settings) -> Settings:
    """The module's database with no profiles and no project settings (before any
    app of the test starts, so its table loads empty)."""
    await execute(profiles_database, delete(ProjectProfileSettings))
    await execute(profiles_database, delete(ModelProfile))
    return profiles_database


@pytest.fixture
async def app_client(
    profiles_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Any]]:
    async with AsyncTestClient(app=make_app(profiles_settings)) as client:
        yield client


def unique_id(tag: str = "p") -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def profile_body(profile_id: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": profile_id, "name": f"Profile {profile_id}", "baseModel": "m"}
    body.update(fields)
    return body


async def create_profile(client: Any, profile_id: str, **fields: Any) -> dict[str, Any]:
    response = await client.post(BASE, json=profile_body(profile_id, **fields), headers=ADMIN)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def patch_profile(client: Any, profile_id: str, **fields: Any) -> dict[str, Any]:
    response = await client.patch(f"{BASE}/{profile_id}", json=fields, headers=ADMIN)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def put_models(
    client: Any, project_id: str, headers: dict[str, str], **fields: Any
) -> dict[str, Any]:
    response = await client.put(f"/api/projects/{project_id}/models", json=fields, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def llms(client: Any, runtime: dict[str, str]) -> dict[str, Any]:
    response = await client.get("/api/runtime/llms", headers=runtime)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def owner_project(client: Client) -> tuple[dict[str, str], dict[str, Any]]:
    """A fresh user and a project they own: (their headers, the project)."""
    _, headers = await new_user(client, "owner")
    return headers, await new_project(client, headers)


async def runtime_headers(client: Any, project_id: str, headers: dict[str, str]) -> dict[str, str]:
    return bearer((await create_runtime_token(client, project_id, headers))["token"])


async def api_key_headers(client: Any, project_id: str, headers: dict[str, str]) -> dict[str, str]:
    return bearer((await create_api_key(client, project_id, headers))["key"])


class QueryLog:
    """SQL statements an app sent to its database (all threads, all connections)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def touching(self, *tables: str) -> list[str]:
        return [s for s in self.statements if any(t in s for t in tables)]


@contextlib.contextmanager
def query_log(client: Client) -> Iterator[QueryLog]:
    engine = resources_of(client).db_config.get_engine().sync_engine
    log = QueryLog()

    def record(*args: Any) -> None:
        log.statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield log
    finally:
        event.remove(engine, "before_cursor_execute", record)
