"""Model-profile admin API through the real app (PostgreSQL + Redis): CRUD,
validation, references between profiles, cleanup of project settings, auth."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from app.routing.profiles import Profile
from tests.support.api import Client, resources_of, set_user_flags, settings_of, user_with_id
from tests.support.auth import fresh_database
from tests.support.helpers import assert_error, new_user
from tests.support.profiles import (
    ADMIN,
    ADMIN_TOKEN,
    BASE,
    PROFILE_FIELDS,
    api_key_headers,
    app_client,
    create_profile,
    llms,
    owner_project,
    patch_profile,
    profile_body,
    profiles_database,
    profiles_settings,
    put_models,
    runtime_headers,
    unique_id,
)
from tests.support.settings import AppFactory, with_settings

__all__ = ["app_client", "profiles_database", "profiles_settings"]

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")


# ------------------------------------------------------------------ create / read


async def test_create_a_profile_and_read_it_back(app_client: Client) -> None:
    await create_profile(app_client, "llm")
    response = await app_client.post(
        BASE,
        json={
            "id": "llm-smart",
            "name": "  Smart  ",
            "baseModel": "llama-3.1-70b",
            "tags": [" smart", "gpu ", "smart", "gpu"],
            "supportsTools": True,
            "supportsImages": True,
            "contextWindowTokens": 131072,
            "maxOutputTokens": 8192,
            "enabled": True,
            "fallbackProfileId": "llm",
            "slowThresholdMs": 2500,
            "failoverChain": ["llm"],
            "routingScore": "seed",
        },
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == PROFILE_FIELDS
    assert {k: v for k, v in body.items() if k not in ("createdAt", "updatedAt")} == {
        "id": "llm-smart",
        "name": "Smart",
        "baseModel": "llama-3.1-70b",
        "tags": ["gpu", "smart"],  # trimmed, de-duplicated (and sorted)
        "supportsTools": True,
        "supportsImages": True,
        "contextWindowTokens": 131072,
        "maxOutputTokens": 8192,
        "enabled": True,
        "fallbackProfileId": "llm",
        "slowThresholdMs": 2500,
        "failoverChain": ["llm"],
        "routingScore": "seed",
    }
    assert ISO_UTC.match(body["createdAt"])
    assert ISO_UTC.match(body["updatedAt"])

    shown = await app_client.get(f"{BASE}/llm-smart", headers=ADMIN)
    assert shown.status_code == 200, shown.text
    assert shown.json() == body
    # Applied to this replica's routing table at once.
    assert resources_of(app_client).profile_table.get("llm-smart") == Profile(
        id="llm-smart",
        name="Smart",
        base_model="llama-3.1-70b",
        tags=frozenset({"gpu", "smart"}),
        supports_tools=True,
        supports_images=True,
        context_window_tokens=131072,
        max_output_tokens=8192,
        enabled=True,
        fallback_profile_id="llm",
        slow_threshold_ms=2500,
        failover_chain=("llm",),
        routing_score="seed",
    )


async def test_defaults_of_a_minimal_profile(app_client: Client) -> None:
    response = await app_client.post(
        BASE, json={"id": "a.b_c-1", "name": "A", "baseModel": "m"}, headers=ADMIN
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["tags"] == []
    assert (body["supportsTools"], body["supportsImages"], body["enabled"]) == (False, False, True)
    assert (body["contextWindowTokens"], body["maxOutputTokens"]) == (8192, 2048)
    assert (body["fallbackProfileId"], body["slowThresholdMs"], body["failoverChain"]) == (
        None,
        None,
        [],
    )
    assert body["routingScore"] is None
    table_row = resources_of(app_client).profile_table.get("a.b_c-1")
    assert table_row is not None
    assert table_row.routing_score is None


async def test_list_is_paginated_and_ordered_by_id(app_client: Client) -> None:
    for profile_id in ("c", "a", "b", "d"):
        await create_profile(app_client, profile_id)
    response = await app_client.get(BASE, headers=ADMIN)
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == {"items", "total", "limit", "offset"}
    assert (page["total"], page["limit"], page["offset"]) == (4, 50, 0)
    assert [p["id"] for p in page["items"]] == ["a", "b", "c", "d"]
    assert all(set(p) == PROFILE_FIELDS for p in page["items"])

    second = (await app_client.get(f"{BASE}?limit=2&offset=1", headers=ADMIN)).json()
    assert [p["id"] for p in second["items"]] == ["b", "c"]
    assert (second["total"], second["limit"], second["offset"]) == (4, 2, 1)
    assert_error(await app_client.get(f"{BASE}?limit=0", headers=ADMIN), 400)


async def test_a_duplicate_id_is_a_conflict(app_client: Client) -> None:
    await create_profile(app_client, "llm", name="First")
    response = await app_client.post(BASE, json=profile_body("llm", name="Again"), headers=ADMIN)
    error = assert_error(response, 409, "profile_exists")
    assert error["param"] == "id"
    assert (await app_client.get(f"{BASE}/llm", headers=ADMIN)).json()["name"] == "First"


async def test_an_unknown_profile_is_a_404(app_client: Client) -> None:
    for response in (
        await app_client.get(f"{BASE}/nope", headers=ADMIN),
        await app_client.patch(f"{BASE}/nope", json={"name": "x"}, headers=ADMIN),
        await app_client.delete(f"{BASE}/nope", headers=ADMIN),
    ):
        assert_error(response, 404, "profile_not_found")


# ------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"id": "-starts-with-dash"}, "invalid_request", "id"),
        ({"id": "has space"}, "invalid_request", "id"),
        ({"id": "slash/inside"}, "invalid_request", "id"),
        ({"id": "x" * 65}, "invalid_request", "id"),
        ({"id": ""}, "invalid_request", "id"),
        ({"id": "trailing\n"}, "invalid_profile_id", "id"),
        ({"name": "   "}, "invalid_request", "name"),
        ({"baseModel": ""}, "invalid_request", "baseModel"),
        ({"name": None}, "invalid_request", "name"),
        ({"contextWindowTokens": 0}, "invalid_request", "contextWindowTokens"),
        ({"maxOutputTokens": -1}, "invalid_request", "maxOutputTokens"),
        ({"contextWindowTokens": "many"}, "invalid_request", "contextWindowTokens"),
        ({"slowThresholdMs": 0}, "invalid_request", "slowThresholdMs"),
        ({"supportsTools": "sometimes"}, "invalid_request", "supportsTools"),
        ({"tags": ["ok", "  "]}, "invalid_request", "tags[1]"),
        ({"tags": "gpu"}, "invalid_request", "tags"),
        ({"failoverChain": ["bad id"]}, "invalid_request", "failoverChain[0]"),
        ({"unknownField": 1}, "invalid_request", "unknownField"),
        ({"created_at": "2020-01-01"}, "invalid_request", "created_at"),
        ({"fallbackProfileId": "ghost"}, "unknown_profile", "fallbackProfileId"),
        ({"fallbackProfileId": "self"}, "self_reference", "fallbackProfileId"),
        ({"failoverChain": ["base", "ghost"]}, "unknown_profile", "failoverChain"),
        ({"failoverChain": ["base", "base"]}, "duplicate_profile", "failoverChain"),
        ({"failoverChain": ["self"]}, "self_reference", "failoverChain"),
        ({"routingScore": "fastest"}, "invalid_request", "routingScore"),
        ({"routingScore": "Capacity"}, "invalid_request", "routingScore"),
        ({"routingScore": ""}, "invalid_request", "routingScore"),
        ({"routingScore": 1}, "invalid_request", "routingScore"),
        ({"routing_score": "seed"}, "invalid_request", "routing_score"),
    ],
)
async def test_invalid_profiles_are_refused(
    app_client: Client, fields: dict[str, Any], code: str, param: str
) -> None:
    await create_profile(app_client, "base")
    body = profile_body("self", **fields)
    response = await app_client.post(BASE, json=body, headers=ADMIN)
    error = assert_error(response, 400, code)
    assert error["param"] == param, error
    assert (await app_client.get(f"{BASE}/self", headers=ADMIN)).status_code == 404


async def test_missing_required_fields_and_bodies(app_client: Client) -> None:
    error = assert_error(await app_client.post(BASE, json={"id": "x"}, headers=ADMIN), 400)
    assert error["param"] in ("name", "baseModel")
    assert_error(await app_client.post(BASE, json=["x"], headers=ADMIN), 400)
    assert_error(
        await app_client.post(
            BASE, content=b"{not json", headers={**ADMIN, "content-type": "application/json"}
        ),
        400,
        "invalid_json",
    )


# ------------------------------------------------------------------------ update


async def test_patch_changes_only_the_given_fields(app_client: Client) -> None:
    await create_profile(app_client, "base")
    created = await create_profile(
        app_client,
        "llm",
        tags=["a"],
        supportsTools=True,
        fallbackProfileId="base",
        slowThresholdMs=1000,
        failoverChain=["base"],
    )
    await asyncio.sleep(0.01)
    updated = await patch_profile(app_client, "llm", name=" Renamed ", tags=["b ", "b"])
    assert updated["name"] == "Renamed"
    assert updated["tags"] == ["b"]
    unchanged = {k: v for k, v in created.items() if k not in ("name", "tags", "updatedAt")}
    assert {k: v for k, v in updated.items() if k in unchanged} == unchanged
    assert updated["updatedAt"] > created["updatedAt"]
    assert resources_of(app_client).profile_table.get("llm").name == "Renamed"  # type: ignore[union-attr]

    # null clears the optional fields; an empty chain clears the chain.
    cleared = await patch_profile(
        app_client, "llm", fallbackProfileId=None, slowThresholdMs=None, failoverChain=[]
    )
    assert (cleared["fallbackProfileId"], cleared["slowThresholdMs"], cleared["failoverChain"]) == (
        None,
        None,
        [],
    )
    assert cleared["supportsTools"] is True
    table_row = resources_of(app_client).profile_table.get("llm")
    assert table_row is not None
    assert (table_row.fallback_profile_id, table_row.failover_chain) == (None, ())

    # An empty patch changes nothing.
    assert (await patch_profile(app_client, "llm"))["name"] == "Renamed"


async def test_the_routing_score_is_set_changed_cleared_and_reaches_routing(
    app_client: Client,
) -> None:
    def in_table() -> str | None:
        row = resources_of(app_client).profile_table.get("scored")
        assert row is not None
        return row.routing_score

    created = await create_profile(app_client, "scored", routingScore="capacity")
    assert created["routingScore"] == "capacity"
    assert in_table() == "capacity"

    changed = await patch_profile(app_client, "scored", routingScore="seed")
    assert changed["routingScore"] == "seed"
    assert in_table() == "seed"
    # Another field's patch keeps it.
    renamed = await patch_profile(app_client, "scored", name="Renamed")
    assert renamed["routingScore"] == "seed"
    assert (await app_client.get(f"{BASE}/scored", headers=ADMIN)).json() == renamed

    # null: back to the platform default.
    cleared = await patch_profile(app_client, "scored", routingScore=None)
    assert cleared["routingScore"] is None
    assert in_table() is None
    listed = (await app_client.get(BASE, headers=ADMIN)).json()
    [item] = [p for p in listed["items"] if p["id"] == "scored"]
    assert item["routingScore"] is None


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"name": None}, "invalid_request", "name"),
        ({"enabled": None}, "invalid_request", "enabled"),
        ({"tags": None}, "invalid_request", "tags"),
        ({"id": "other"}, "invalid_request", "id"),
        ({"contextWindowTokens": 0}, "invalid_request", "contextWindowTokens"),
        ({"fallbackProfileId": "llm"}, "self_reference", "fallbackProfileId"),
        ({"fallbackProfileId": "ghost"}, "unknown_profile", "fallbackProfileId"),
        ({"failoverChain": ["base", "llm"]}, "self_reference", "failoverChain"),
        ({"failoverChain": ["base", "base"]}, "duplicate_profile", "failoverChain"),
        ({"failoverChain": ["ghost"]}, "unknown_profile", "failoverChain"),
        ({"routingScore": "fastest"}, "invalid_request", "routingScore"),
        ({"routingScore": ["seed"]}, "invalid_request", "routingScore"),
    ],
)
async def test_invalid_patches_are_refused(
    app_client: Client, fields: dict[str, Any], code: str, param: str
) -> None:
    await create_profile(app_client, "base")
    before = await create_profile(app_client, "llm")
    response = await app_client.patch(f"{BASE}/llm", json=fields, headers=ADMIN)
    error = assert_error(response, 400, code)
    assert error["param"] == param, error
    assert (await app_client.get(f"{BASE}/llm", headers=ADMIN)).json() == before


# ------------------------------------------------------------------------ delete


async def test_delete_a_profile(app_client: Client) -> None:
    await create_profile(app_client, "llm")
    response = await app_client.delete(f"{BASE}/llm", headers=ADMIN)
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert_error(await app_client.get(f"{BASE}/llm", headers=ADMIN), 404, "profile_not_found")
    assert resources_of(app_client).profile_table.get("llm") is None


async def test_a_profile_named_by_others_cannot_be_deleted(app_client: Client) -> None:
    await create_profile(app_client, "base")
    await create_profile(app_client, "uses-fallback", fallbackProfileId="base")
    await create_profile(app_client, "uses-chain", failoverChain=["base"])
    await create_profile(app_client, "unrelated")
    error = assert_error(
        await app_client.delete(f"{BASE}/base", headers=ADMIN), 409, "profile_in_use"
    )
    assert "uses-fallback" in error["message"]
    assert "uses-chain" in error["message"]
    assert "unrelated" not in error["message"]
    assert (await app_client.get(f"{BASE}/base", headers=ADMIN)).status_code == 200

    # Once nobody names it, it can go.
    await patch_profile(app_client, "uses-fallback", fallbackProfileId=None)
    await patch_profile(app_client, "uses-chain", failoverChain=[])
    assert (await app_client.delete(f"{BASE}/base", headers=ADMIN)).status_code == 204


async def test_deleting_a_profile_cleans_up_project_settings(app_client: Client) -> None:
    # ``x_1`` would match a LIKE pattern for ``x-1`` that left ``_`` unescaped... and
    # the reverse: deleting ``x-1`` must not touch settings naming ``x_1``.
    for profile_id in ("x-1", "x_1", "y"):
        await create_profile(app_client, profile_id)
    headers, project = await owner_project(app_client)
    _, other = await owner_project(app_client)
    _, third = await owner_project(app_client)
    await put_models(
        app_client, project["id"], headers, defaultProfileId="x-1", enabledProfileIds=["x-1", "y"]
    )
    await put_models(app_client, other["id"], ADMIN, enabledProfileIds=["x-1"])
    await put_models(
        app_client, third["id"], ADMIN, defaultProfileId="x_1", enabledProfileIds=["x_1", "y"]
    )

    assert (await app_client.delete(f"{BASE}/x-1", headers=ADMIN)).status_code == 204

    shown = (await app_client.get(f"/api/projects/{project['id']}/models", headers=headers)).json()
    assert (shown["defaultProfileId"], shown["enabledProfileIds"]) == (None, ["y"])
    assert shown["catalog"]["defaultLlmId"] == "y"
    emptied = (await app_client.get(f"/api/projects/{other['id']}/models", headers=ADMIN)).json()
    assert (emptied["defaultProfileId"], emptied["enabledProfileIds"]) == (None, [])
    assert emptied["catalog"]["defaultLlmId"] is None
    assert [llm["enabled"] for llm in emptied["catalog"]["llms"]] == [False, False]
    untouched = (await app_client.get(f"/api/projects/{third['id']}/models", headers=ADMIN)).json()
    assert (untouched["defaultProfileId"], untouched["enabledProfileIds"]) == ("x_1", ["x_1", "y"])

    # A new profile under the old id is not enabled where the old one was: the cached
    # settings of those projects were dropped with the deletion, not kept.
    runtime = await runtime_headers(app_client, other["id"], ADMIN)
    await create_profile(app_client, "x-1")
    catalog = await llms(app_client, runtime)
    assert {llm["id"]: llm["enabled"] for llm in catalog["llms"]} == {
        "x-1": False,
        "x_1": False,
        "y": False,
    }


# -------------------------------------------------------------------------- auth


async def test_only_platform_admins_reach_the_admin_api(app_client: Client) -> None:
    await create_profile(app_client, "llm")
    body = profile_body(unique_id())
    calls = [
        ("GET", BASE, None),
        ("POST", BASE, body),
        ("GET", f"{BASE}/llm", None),
        ("PATCH", f"{BASE}/llm", {"name": "x"}),
        ("DELETE", f"{BASE}/llm", None),
    ]
    _, user_headers = await new_user(app_client, "plain")
    owner_headers, project = await owner_project(app_client)
    key = await api_key_headers(app_client, project["id"], owner_headers)
    runtime = await runtime_headers(app_client, project["id"], owner_headers)
    for method, path, json in calls:
        response = await app_client.request(method, path, json=json)
        assert_error(response, 401)
        for headers in (user_headers, owner_headers, key, runtime):
            response = await app_client.request(method, path, json=json, headers=headers)
            assert_error(response, 403)
        response = await app_client.request(
            method, path, json=json, headers={"Authorization": "Bearer not-a-token"}
        )
        assert_error(response, 401)
    assert (await app_client.get(f"{BASE}/llm", headers=ADMIN)).json()["name"] != "x"


async def test_an_admin_user_manages_profiles(app_client: Client) -> None:
    _, headers, user_id = await user_with_id(app_client, "admin")
    assert_error(await app_client.get(BASE, headers=headers), 403, "admin_required")
    await set_user_flags(settings_of(app_client), user_id, is_admin=True)
    response = await app_client.post(BASE, json=profile_body("by-admin"), headers=headers)
    assert response.status_code == 201, response.text
    assert (await app_client.delete(f"{BASE}/by-admin", headers=headers)).status_code == 204


async def test_cleanup_on_delete_works_on_the_embedded_sqlite_default(
    make_app: AppFactory, tmp_path: Path
) -> None:
    async with fresh_database("sqlite", tmp_path) as settings:
        app = make_app(with_settings(settings, admin_token=ADMIN_TOKEN))
        async with AsyncTestClient(app=app) as client:
            for profile_id in ("x-1", "x_1", "y"):
                await create_profile(client, profile_id)
            _, project = await owner_project(client)
            _, other = await owner_project(client)
            await put_models(
                client, project["id"], ADMIN, defaultProfileId="x-1", enabledProfileIds=["x-1", "y"]
            )
            await put_models(client, other["id"], ADMIN, enabledProfileIds=["x_1"])
            assert (await client.delete(f"{BASE}/x-1", headers=ADMIN)).status_code == 204
            path = "/api/projects/{}/models"
            shown = (await client.get(path.format(project["id"]), headers=ADMIN)).json()
            assert (shown["defaultProfileId"], shown["enabledProfileIds"]) == (None, ["y"])
            kept = (await client.get(path.format(other["id"]), headers=ADMIN)).json()
            assert kept["enabledProfileIds"] == ["x_1"]
