"""``GET /api/runtime/llms`` and the resolver behind the runtime chat.

Through the real app (PostgreSQL + Redis): the exact shape, who may call it, that a
cached entry costs no database query, and that profile and settings changes reach the
cache, on this replica and on another. ``ProfileCatalog`` itself (the resolver's
rules) is driven directly with an in-memory settings loader.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any
from uuid import UUID

import httpx
import pytest
from litestar import Litestar

from app.domain.profiles.catalog import ProfileCatalog, ProjectModels
from app.lib.errors import BadRequestError, NotFoundError
from app.lib.settings import Settings
from app.routing.profiles import Profile, ProfileTable
from app.server.resources import Resources
from tests.support.api import Client, create_runtime_token, eventually
from tests.support.auth import http_login, http_register
from tests.support.helpers import assert_error, bearer, unique_email
from tests.support.live_server import live_server
from tests.support.profiles import (
    ADMIN,
    BASE,
    CATALOG_FIELDS,
    LLM_FIELDS,
    PROFILE_TABLES,
    api_key_headers,
    app_client,
    create_profile,
    llms,
    owner_project,
    patch_profile,
    profiles_database,
    profiles_settings,
    put_models,
    query_log,
    runtime_headers,
)
from tests.support.settings import AppFactory

__all__ = ["app_client", "profiles_database", "profiles_settings"]


async def project_with_runtime(
    client: Any,
) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    headers, project = await owner_project(client)
    return headers, project, await runtime_headers(client, project["id"], headers)


# --------------------------------------------------------------------- the shape


async def test_the_catalog_has_exactly_the_documented_shape(app_client: Client) -> None:
    await create_profile(
        app_client,
        "llm-smart",
        name="Smart",
        tags=["smart", "gpu"],
        supportsTools=True,
        supportsImages=True,
        contextWindowTokens=131072,
        maxOutputTokens=8192,
        slowThresholdMs=2000,
    )
    await create_profile(app_client, "llm", name="Plain")
    await create_profile(app_client, "zz-off", name="Off", enabled=False)
    _, project, runtime = await project_with_runtime(app_client)

    before = int(time.time() * 1000)
    body = await llms(app_client, runtime)
    after = int(time.time() * 1000)
    assert set(body) == CATALOG_FIELDS
    assert body["projectId"] == project["id"]
    assert isinstance(body["defaultLlmId"], str)
    assert body["defaultLlmId"] == "llm"
    assert type(body["refreshedAt"]) is int
    assert before - 1 <= body["refreshedAt"] <= after + 1
    assert isinstance(body["llms"], list)
    for llm in body["llms"]:
        assert set(llm) == LLM_FIELDS
        assert isinstance(llm["id"], str)
        assert isinstance(llm["name"], str)
        for flag in ("enabled", "supportsTools", "supportsImages"):
            assert type(llm[flag]) is bool
        for count in ("contextWindowTokens", "maxOutputTokens"):
            assert type(llm[count]) is int
        assert isinstance(llm["tags"], list)
        assert all(isinstance(tag, str) for tag in llm["tags"])
    assert body["llms"] == [
        {
            "id": "llm",
            "name": "Plain",
            "enabled": True,
            "supportsTools": False,
            "supportsImages": False,
            "contextWindowTokens": 8192,
            "maxOutputTokens": 2048,
            "tags": [],
        },
        {
            "id": "llm-smart",
            "name": "Smart",
            "enabled": True,
            "supportsTools": True,
            "supportsImages": True,
            "contextWindowTokens": 131072,
            "maxOutputTokens": 8192,
            "tags": ["gpu", "smart"],
        },
        {
            "id": "zz-off",
            "name": "Off",
            "enabled": False,
            "supportsTools": False,
            "supportsImages": False,
            "contextWindowTokens": 8192,
            "maxOutputTokens": 2048,
            "tags": [],
        },
    ]


async def test_no_profiles_means_an_empty_catalog(app_client: Client) -> None:
    _, project, runtime = await project_with_runtime(app_client)
    body = await llms(app_client, runtime)
    assert {k: v for k, v in body.items() if k != "refreshedAt"} == {
        "projectId": project["id"],
        "defaultLlmId": None,
        "llms": [],
    }


async def test_default_rules(app_client: Client) -> None:
    for profile_id in ("a", "b", "c"):
        await create_profile(app_client, profile_id)
    headers, project, runtime = await project_with_runtime(app_client)
    assert (await llms(app_client, runtime))["defaultLlmId"] == "a"  # first enabled by id
    await put_models(app_client, project["id"], headers, defaultProfileId="c")
    assert (await llms(app_client, runtime))["defaultLlmId"] == "c"  # the project's choice
    await patch_profile(app_client, "c", enabled=False)
    assert (await llms(app_client, runtime))["defaultLlmId"] == "a"  # no longer enabled
    await put_models(app_client, project["id"], headers, enabledProfileIds=["b", "c"])
    assert (await llms(app_client, runtime))["defaultLlmId"] == "b"  # first enabled for it
    await patch_profile(app_client, "b", enabled=False)
    body = await llms(app_client, runtime)
    assert body["defaultLlmId"] is None  # nothing enabled at all
    assert [llm["enabled"] for llm in body["llms"]] == [False, False, False]


async def test_only_runtime_tokens_read_the_catalog(app_client: Client) -> None:
    await create_profile(app_client, "llm")
    headers, project, runtime = await project_with_runtime(app_client)
    key = await api_key_headers(app_client, project["id"], headers)
    for caller in (headers, key, ADMIN):
        response = await app_client.get("/api/runtime/llms", headers=caller)
        assert_error(response, 403, "runtime_token_required")
    assert_error(await app_client.get("/api/runtime/llms"), 401)
    assert_error(await app_client.get("/api/runtime/llms", headers=bearer("nope.nope.nope")), 401)
    token = await create_runtime_token(app_client, project["id"], headers)
    await app_client.delete(
        f"/api/projects/{project['id']}/runtime-tokens/{token['id']}", headers=headers
    )
    assert_error(await app_client.get("/api/runtime/llms", headers=bearer(token["token"])), 401)
    assert (await app_client.get("/api/runtime/llms", headers=runtime)).status_code == 200


# ------------------------------------------------------------------ the cache


async def test_a_cached_catalog_costs_no_database_query(app_client: Client) -> None:
    await create_profile(app_client, "llm")
    _, project, runtime = await project_with_runtime(app_client)
    with query_log(app_client) as first_log:
        first = await llms(app_client, runtime)
    # The first request read the project's settings (and nothing else of profiles).
    assert len(first_log.touching("project_profile_settings")) == 1
    assert first_log.touching("model_profiles") == []

    with query_log(app_client) as log:
        for _ in range(5):
            assert await llms(app_client, runtime) == first
    assert log.statements == []

    # The API's own cache, not a client-side one: another runtime token of the project
    # is served the same entry.
    other_runtime = await runtime_headers(app_client, project["id"], ADMIN)
    with query_log(app_client) as log:
        assert (await llms(app_client, other_runtime))["refreshedAt"] == first["refreshedAt"]
    assert log.touching(*PROFILE_TABLES) == []


async def test_a_profile_change_invalidates_the_catalog(app_client: Client) -> None:
    await create_profile(app_client, "llm", name="Before")
    _, _, runtime = await project_with_runtime(app_client)
    first = await llms(app_client, runtime)
    await asyncio.sleep(0.005)

    await patch_profile(app_client, "llm", name="After")
    with query_log(app_client) as log:
        changed = await llms(app_client, runtime)
    assert changed["llms"][0]["name"] == "After"
    assert changed["refreshedAt"] > first["refreshedAt"]
    # Rebuilt from the cached project settings: still no database query.
    assert log.touching(*PROFILE_TABLES) == []
    assert (await llms(app_client, runtime))["refreshedAt"] == changed["refreshedAt"]

    await asyncio.sleep(0.005)
    await create_profile(app_client, "llm-2")
    added = await llms(app_client, runtime)
    assert [llm["id"] for llm in added["llms"]] == ["llm", "llm-2"]
    assert added["refreshedAt"] > changed["refreshedAt"]

    await asyncio.sleep(0.005)
    assert (await app_client.delete(f"{BASE}/llm", headers=ADMIN)).status_code == 204
    removed = await llms(app_client, runtime)
    assert [llm["id"] for llm in removed["llms"]] == ["llm-2"]
    assert removed["defaultLlmId"] == "llm-2"
    assert removed["refreshedAt"] > added["refreshedAt"]


async def test_a_settings_change_invalidates_the_catalog(app_client: Client) -> None:
    for profile_id in ("a", "b"):
        await create_profile(app_client, profile_id)
    headers, project, runtime = await project_with_runtime(app_client)
    _, other, other_runtime = await project_with_runtime(app_client)
    first = await llms(app_client, runtime)
    other_first = await llms(app_client, other_runtime)
    assert first["defaultLlmId"] == "a"
    await asyncio.sleep(0.005)

    await put_models(app_client, project["id"], headers, defaultProfileId="b")
    changed = await llms(app_client, runtime)
    assert changed["defaultLlmId"] == "b"
    assert changed["refreshedAt"] > first["refreshedAt"]
    # Only that project's entry was dropped.
    assert await llms(app_client, other_runtime) == other_first
    assert other["id"] != project["id"]


# --------------------------------------------------------------- two replicas


async def test_changes_on_one_replica_reach_the_others_catalog(
    profiles_settings: Settings, make_app: AppFactory
) -> None:
    app_a, app_b = make_app(profiles_settings), make_app(profiles_settings)
    async with (
        live_server(app_a) as url_a,
        live_server(app_b) as url_b,
        httpx.AsyncClient(base_url=url_a) as a,
        httpx.AsyncClient(base_url=url_b) as b,
    ):
        assert (await a.post(BASE, json=_body("llm"), headers=ADMIN)).status_code == 201
        email = unique_email("owner")
        assert (await http_register(a, email)).status_code == 201
        headers = bearer((await http_login(a, email)).json()["accessToken"])
        slug = f"r-{uuid.uuid4().hex[:8]}"
        project = await a.post("/api/projects", json={"name": "R", "slug": slug}, headers=headers)
        project_id = project.json()["id"]
        token = await a.post(f"/api/projects/{project_id}/runtime-tokens", headers=headers)
        runtime = bearer(token.json()["token"])

        async def on_b() -> dict[str, Any]:
            response = await b.get("/api/runtime/llms", headers=runtime)
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

        async def b_shows(check: Any) -> None:
            async def holds() -> bool:
                return bool(check(await on_b()))

            await eventually(holds, within=5.0)

        # B learns of "llm" (created on A before B's first request or through the event).
        await b_shows(lambda body: [llm["id"] for llm in body["llms"]] == ["llm"])
        cached = await on_b()
        assert (await on_b())["refreshedAt"] == cached["refreshedAt"]

        # A profile change on A.
        response = await a.patch(f"{BASE}/llm", json={"name": "Renamed"}, headers=ADMIN)
        assert response.status_code == 200, response.text
        await b_shows(lambda body: body["llms"][0]["name"] == "Renamed")
        assert table_of(app_b).get("llm") == Profile(id="llm", name="Renamed", base_model="m")

        # A new profile on A, then the project's settings on A.
        assert (await a.post(BASE, json=_body("llm-2"), headers=ADMIN)).status_code == 201
        await b_shows(lambda body: [llm["id"] for llm in body["llms"]] == ["llm", "llm-2"])
        response = await a.put(
            f"/api/projects/{project_id}/models",
            json={"defaultProfileId": "llm-2"},
            headers=headers,
        )
        assert response.status_code == 200, response.text
        await b_shows(lambda body: body["defaultLlmId"] == "llm-2")

        # A deletion on A (which also rewrote the project's settings).
        assert (await a.delete(f"{BASE}/llm-2", headers=ADMIN)).status_code == 204
        await b_shows(
            lambda body: (
                [llm["id"] for llm in body["llms"]] == ["llm"] and body["defaultLlmId"] == "llm"
            )
        )
        assert table_of(app_b).get("llm-2") is None


def _body(profile_id: str) -> dict[str, Any]:
    return {"id": profile_id, "name": profile_id, "baseModel": "m"}


def table_of(app: Litestar) -> ProfileTable:
    resources: Resources = app.state.resources
    return resources.profile_table


# ------------------------------------------------- the resolver, in isolation


class MemorySettings(dict[UUID, ProjectModels]):
    """Project settings in memory; counts reads as a database would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def load(self, project_id: UUID) -> ProjectModels:
        self.reads += 1
        await asyncio.sleep(0)
        return self.get(project_id, ProjectModels())


def _catalog(*profiles: Profile) -> tuple[ProfileCatalog, ProfileTable, MemorySettings]:
    table = ProfileTable(profiles)
    stored = MemorySettings()
    return ProfileCatalog(table, stored.load), table, stored


PROJECT = uuid.uuid4()


async def test_resolve_uses_the_request_then_the_default() -> None:
    catalog, _, stored = _catalog(
        Profile(id="a", name="A", base_model="m"),
        Profile(id="b", name="B", base_model="m"),
    )
    assert (await catalog.resolve(PROJECT, None)).id == "a"
    assert (await catalog.resolve(PROJECT, "b")).id == "b"
    stored[PROJECT] = ProjectModels(default_profile_id="b")
    assert (await catalog.resolve(PROJECT, None)).id == "a"  # cached until invalidated
    catalog.invalidate_project(PROJECT)
    assert (await catalog.resolve(PROJECT, None)).id == "b"
    assert await catalog.is_enabled_for(PROJECT, "a")
    assert not await catalog.is_enabled_for(PROJECT, "ghost")
    assert stored.reads == 2


async def test_resolve_refuses_unknown_and_disabled_profiles() -> None:
    catalog, table, stored = _catalog(
        Profile(id="a", name="A", base_model="m"),
        Profile(id="b", name="B", base_model="m"),
        Profile(id="off", name="Off", base_model="m", enabled=False),
    )
    stored[PROJECT] = ProjectModels(enabled_profile_ids=frozenset({"a", "off"}))

    with pytest.raises(NotFoundError) as unknown:
        await catalog.resolve(PROJECT, "ghost")
    assert (unknown.value.status_code, unknown.value.code, unknown.value.param) == (
        404,
        "profile_not_found",
        "modelProfileId",
    )
    for profile_id in ("b", "off"):  # off for the project, off on the platform
        with pytest.raises(BadRequestError) as disabled:
            await catalog.resolve(PROJECT, profile_id)
        assert (disabled.value.code, disabled.value.param) == ("profile_disabled", "modelProfileId")
        assert not await catalog.is_enabled_for(PROJECT, profile_id)

    table.put(Profile(id="a", name="A", base_model="m", enabled=False))
    with pytest.raises(BadRequestError) as no_default:
        await catalog.resolve(PROJECT, None)
    assert (no_default.value.status_code, no_default.value.code) == (400, "no_default_profile")
    # Profile changes are applied from the cached settings.
    assert stored.reads == 1


async def test_concurrent_misses_share_one_read_and_a_stale_read_is_not_kept() -> None:
    catalog, _, stored = _catalog(Profile(id="a", name="A", base_model="m"))
    results = await asyncio.gather(*(catalog.resolve(PROJECT, None) for _ in range(20)))
    assert {p.id for p in results} == {"a"}
    assert stored.reads == 1

    # An invalidation while a read is in flight: that read is not cached.
    catalog.invalidate_project(PROJECT)
    pending = asyncio.ensure_future(catalog.catalog(PROJECT))
    await asyncio.sleep(0)
    stored[PROJECT] = ProjectModels(enabled_profile_ids=frozenset())
    catalog.invalidate_project(PROJECT)
    await pending
    assert (await catalog.catalog(PROJECT)).default_llm_id is None
    assert stored.reads == 3


async def test_the_cache_is_bounded() -> None:
    table = ProfileTable([Profile(id="a", name="A", base_model="m")])
    stored = MemorySettings()
    catalog = ProfileCatalog(table, stored.load, max_projects=3)
    projects = [uuid.uuid4() for _ in range(5)]
    for project_id in projects:
        await catalog.catalog(project_id)
    assert len(catalog) == 3
    await catalog.catalog(projects[-1])
    assert stored.reads == 5
