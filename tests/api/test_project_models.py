"""Per-project model settings on the Projects REST API:
``GET``/``PUT /api/projects/{projectId}/models``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.api import Client, user_with_id
from tests.support.helpers import assert_error
from tests.support.profiles import (
    ADMIN,
    CATALOG_FIELDS,
    api_key_headers,
    app_client,
    create_profile,
    llms,
    owner_project,
    patch_profile,
    profiles_database,
    profiles_settings,
    put_models,
    runtime_headers,
)

__all__ = ["app_client", "profiles_database", "profiles_settings"]


def models_path(project_id: str) -> str:
    return f"/api/projects/{project_id}/models"


async def get_models(client: Client, project_id: str, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.get(models_path(project_id), headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def add_member(
    client: Client, project_id: str, owner: dict[str, str]
) -> tuple[str, dict[str, str]]:
    email, headers, _ = await user_with_id(client, "member")
    response = await client.post(
        f"/api/projects/{project_id}/members", json={"email": email}, headers=owner
    )
    assert response.status_code == 201, response.text
    return email, headers


async def test_without_settings_every_enabled_profile_is_offered(app_client: Client) -> None:
    for profile_id in ("b", "a"):
        await create_profile(app_client, profile_id)
    await create_profile(app_client, "c-off", enabled=False)
    headers, project = await owner_project(app_client)
    body = await get_models(app_client, project["id"], headers)
    assert set(body) == {"defaultProfileId", "enabledProfileIds", "catalog"}
    assert (body["defaultProfileId"], body["enabledProfileIds"]) == (None, None)
    catalog = body["catalog"]
    assert set(catalog) == CATALOG_FIELDS
    assert catalog["projectId"] == project["id"]
    assert catalog["defaultLlmId"] == "a"
    assert [(llm["id"], llm["enabled"]) for llm in catalog["llms"]] == [
        ("a", True),
        ("b", True),
        ("c-off", False),
    ]
    # The same catalog a runtime of the project is served.
    runtime = await runtime_headers(app_client, project["id"], headers)
    assert await llms(app_client, runtime) == catalog


async def test_owner_sets_the_default_and_enabled_set(app_client: Client) -> None:
    for profile_id in ("a", "b", "c"):
        await create_profile(app_client, profile_id)
    headers, project = await owner_project(app_client)
    body = await put_models(
        app_client,
        project["id"],
        headers,
        defaultProfileId="c",
        enabledProfileIds=["c", "a", "c"],  # de-duplicated (and sorted)
    )
    assert (body["defaultProfileId"], body["enabledProfileIds"]) == ("c", ["a", "c"])
    assert body["catalog"]["defaultLlmId"] == "c"
    assert [(llm["id"], llm["enabled"]) for llm in body["catalog"]["llms"]] == [
        ("a", True),
        ("b", False),
        ("c", True),
    ]
    # Members and the project's API key read it.
    _, member = await add_member(app_client, project["id"], headers)
    key = await api_key_headers(app_client, project["id"], headers)
    for reader in (headers, member, key, ADMIN):
        shown = await get_models(app_client, project["id"], reader)
        assert shown == body

    # null/absent resets to "every enabled profile, first by id as default".
    reset = await put_models(app_client, project["id"], headers)
    assert (reset["defaultProfileId"], reset["enabledProfileIds"]) == (None, None)
    assert reset["catalog"]["defaultLlmId"] == "a"
    assert all(llm["enabled"] for llm in reset["catalog"]["llms"])


async def test_null_enabled_set_follows_new_profiles(app_client: Client) -> None:
    await create_profile(app_client, "b")
    headers, project = await owner_project(app_client)
    await put_models(app_client, project["id"], headers, defaultProfileId="b")
    await create_profile(app_client, "a-new")
    body = await get_models(app_client, project["id"], headers)
    assert [(llm["id"], llm["enabled"]) for llm in body["catalog"]["llms"]] == [
        ("a-new", True),
        ("b", True),
    ]
    assert body["catalog"]["defaultLlmId"] == "b"

    # An explicit set does not grow by itself.
    await put_models(app_client, project["id"], headers, enabledProfileIds=["b"])
    await create_profile(app_client, "c-new")
    body = await get_models(app_client, project["id"], headers)
    assert {llm["id"]: llm["enabled"] for llm in body["catalog"]["llms"]} == {
        "a-new": False,
        "b": True,
        "c-new": False,
    }


async def test_a_default_that_stops_being_enabled_falls_back(app_client: Client) -> None:
    for profile_id in ("a", "b"):
        await create_profile(app_client, profile_id)
    headers, project = await owner_project(app_client)
    await put_models(app_client, project["id"], headers, defaultProfileId="b")
    await patch_profile(app_client, "b", enabled=False)
    body = await get_models(app_client, project["id"], headers)
    # The stored choice stays; the catalog shows what is in effect.
    assert body["defaultProfileId"] == "b"
    assert body["catalog"]["defaultLlmId"] == "a"
    await patch_profile(app_client, "b", enabled=True)
    assert (await get_models(app_client, project["id"], headers))["catalog"]["defaultLlmId"] == "b"


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"enabledProfileIds": ["a", "ghost"]}, "unknown_profile", "enabledProfileIds"),
        ({"defaultProfileId": "ghost"}, "unknown_profile", "defaultProfileId"),
        (
            {"defaultProfileId": "b", "enabledProfileIds": ["a"]},
            "default_not_enabled",
            "defaultProfileId",
        ),
        ({"defaultProfileId": "off"}, "default_not_enabled", "defaultProfileId"),
        (
            {"defaultProfileId": "off", "enabledProfileIds": ["off"]},
            "default_not_enabled",
            "defaultProfileId",
        ),
        ({"defaultProfileId": "bad id"}, "invalid_request", "defaultProfileId"),
        ({"enabledProfileIds": ["a", "bad id"]}, "invalid_request", "enabledProfileIds[1]"),
        ({"enabledProfileIds": "a"}, "invalid_request", "enabledProfileIds"),
        ({"defaultProfileId": "a", "extra": True}, "invalid_request", "extra"),
        ({"defaultProfileId": "a\n"}, "invalid_profile_id", "defaultProfileId"),
    ],
)
async def test_invalid_settings_are_refused(
    app_client: Client, fields: dict[str, Any], code: str, param: str
) -> None:
    for profile_id in ("a", "b"):
        await create_profile(app_client, profile_id)
    await create_profile(app_client, "off", enabled=False)
    headers, project = await owner_project(app_client)
    response = await app_client.put(models_path(project["id"]), json=fields, headers=headers)
    error = assert_error(response, 400, code)
    assert error["param"] == param, error
    body = await get_models(app_client, project["id"], headers)
    assert (body["defaultProfileId"], body["enabledProfileIds"]) == (None, None)


async def test_only_owners_and_admins_change_settings(app_client: Client) -> None:
    await create_profile(app_client, "a")
    headers, project = await owner_project(app_client)
    _, member = await add_member(app_client, project["id"], headers)
    key = await api_key_headers(app_client, project["id"], headers)
    runtime = await runtime_headers(app_client, project["id"], headers)
    body = {"enabledProfileIds": ["a"]}
    path = models_path(project["id"])
    for caller in (member, key):
        assert_error(
            await app_client.put(path, json=body, headers=caller), 403, "insufficient_role"
        )
    for method in ("GET", "PUT"):
        response = await app_client.request(method, path, json=body, headers=runtime)
        assert_error(response, 403, "runtime_token_not_allowed")
        assert_error(await app_client.request(method, path, json=body), 401)
    assert (await get_models(app_client, project["id"], headers))["enabledProfileIds"] is None
    # The platform admin token manages any project.
    assert (await put_models(app_client, project["id"], ADMIN, **body))["enabledProfileIds"] == [
        "a"
    ]


async def test_another_projects_settings_are_a_404(app_client: Client) -> None:
    await create_profile(app_client, "a")
    headers, project = await owner_project(app_client)
    stranger, other = await owner_project(app_client)
    other_key = await api_key_headers(app_client, other["id"], stranger)
    for caller in (stranger, other_key):
        for method in ("GET", "PUT"):
            response = await app_client.request(
                method, models_path(project["id"]), json={"defaultProfileId": "a"}, headers=caller
            )
            assert_error(response, 404, "project_not_found")
    missing = "00000000-0000-4000-8000-000000000000"
    assert_error(
        await app_client.get(models_path(missing), headers=ADMIN), 404, "project_not_found"
    )
    assert (await get_models(app_client, project["id"], headers))["defaultProfileId"] is None
