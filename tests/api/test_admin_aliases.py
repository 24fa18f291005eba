"""Alias admin API through the real app: CRUD, validation, auth, restart, replicas."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from tests.support.api import Client, eventually, resources_of, set_user_flags, user_with_id
from tests.support.helpers import assert_error
from tests.support.live_server import live_server
from tests.support.routing import (
    ADMIN,
    admin_client,
    routing_pg_settings,
    routing_settings,
)
from tests.support.settings import AppFactory

__all__ = ["admin_client", "routing_pg_settings", "routing_settings"]

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")


def unique_alias(tag: str = "alias") -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


async def set_alias(client: Client | httpx.AsyncClient, alias: str, target: str) -> Any:
    return await client.post(
        "/api/admin/aliases", json={"alias": alias, "target": target}, headers=ADMIN
    )


async def all_aliases(client: Client) -> dict[str, str]:
    response = await client.get("/api/admin/aliases?limit=500", headers=ADMIN)
    assert response.status_code == 200, response.text
    return {item["alias"]: item["target"] for item in response.json()["items"]}


async def test_create_list_replace_and_delete_an_alias(admin_client: Client) -> None:
    alias = unique_alias()
    table = resources_of(admin_client).alias_table
    response = await set_alias(admin_client, alias, "gpt-4o-mini")
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"alias", "target", "created_at"}
    assert (body["alias"], body["target"]) == (alias, "gpt-4o-mini")
    assert ISO_UTC.match(body["created_at"])
    # Takes effect at once on this replica.
    assert table.resolve(alias) == "gpt-4o-mini"
    assert (await all_aliases(admin_client))[alias] == "gpt-4o-mini"

    replaced = await set_alias(admin_client, alias, "llama3:latest")
    assert replaced.status_code == 201, replaced.text
    assert replaced.json()["target"] == "llama3:latest"
    assert replaced.json()["created_at"] == body["created_at"]
    assert table.resolve(alias) == "llama3:latest"
    listed = await all_aliases(admin_client)
    assert listed[alias] == "llama3:latest"

    deleted = await admin_client.delete(f"/api/admin/aliases/{alias}", headers=ADMIN)
    assert deleted.status_code == 204, deleted.text
    assert alias not in table
    assert table.resolve(alias) == alias
    assert alias not in await all_aliases(admin_client)
    assert_error(
        await admin_client.delete(f"/api/admin/aliases/{alias}", headers=ADMIN),
        404,
        "alias_not_found",
    )


async def test_the_alias_list_is_sorted_and_paginated(admin_client: Client) -> None:
    prefix = unique_alias("page")
    for n in (2, 0, 1):
        assert (await set_alias(admin_client, f"{prefix}-{n}", "m")).status_code == 201
    everything = (await admin_client.get("/api/admin/aliases?limit=500", headers=ADMIN)).json()
    assert set(everything) == {"items", "total", "limit", "offset"}
    names = [i["alias"] for i in everything["items"]]
    assert names == sorted(names)
    assert everything["total"] == len(names)
    page = (await admin_client.get("/api/admin/aliases?limit=2&offset=1", headers=ADMIN)).json()
    assert [i["alias"] for i in page["items"]] == names[1:3]
    assert (page["limit"], page["offset"], page["total"]) == (2, 1, len(names))


BAD_ALIASES: list[tuple[dict[str, Any], str | None]] = [
    ({"alias": "", "target": "m"}, "alias"),
    ({"alias": "   ", "target": "m"}, "alias"),
    ({"alias": "a" * 201, "target": "m"}, "alias"),
    ({"alias": "a", "target": ""}, "target"),
    ({"alias": "a", "target": "m" * 201}, "target"),
    ({"alias": "same", "target": "same"}, "target"),
    ({"alias": " same", "target": "same "}, "target"),
    ({"alias": "a"}, "target"),
    ({"target": "m"}, "alias"),
    ({"alias": "a", "target": "m", "extra": 1}, "extra"),
    ({"alias": 3, "target": "m"}, "alias"),
]


async def test_bad_aliases_are_400_naming_the_field(admin_client: Client) -> None:
    for body, param in BAD_ALIASES:
        response = await admin_client.post("/api/admin/aliases", json=body, headers=ADMIN)
        error = assert_error(response, 400)
        assert error["param"] == param, (body, error)
    error = assert_error(await set_alias(admin_client, "self", "self"), 400, "alias_is_target")
    assert "itself" in error["message"]


async def test_only_platform_admins_reach_the_alias_api(
    routing_settings: Settings, make_app: AppFactory
) -> None:
    async with AsyncTestClient(app=make_app(routing_settings)) as client:
        alias = unique_alias()
        routes = [
            ("POST", "/api/admin/aliases", {"alias": alias, "target": "m"}),
            ("GET", "/api/admin/aliases", None),
            ("DELETE", f"/api/admin/aliases/{alias}", None),
        ]
        _, user, user_id = await user_with_id(client)
        await set_user_flags(routing_settings, user_id, is_admin=False)
        for method, path, json in routes:
            assert_error(await client.request(method, path, json=json), 401)
            assert_error(
                await client.request(method, path, json=json, headers=user), 403, "admin_required"
            )
        assert alias not in resources_of(client).alias_table

        await set_user_flags(routing_settings, user_id, is_admin=True)
        created = await client.post(
            "/api/admin/aliases", json={"alias": alias, "target": "m"}, headers=user
        )
        assert created.status_code == 201, created.text
        deleted = await client.delete(f"/api/admin/aliases/{alias}", headers=user)
        assert deleted.status_code == 204, deleted.text


async def test_aliases_survive_a_restart(routing_settings: Settings, make_app: AppFactory) -> None:
    alias = unique_alias("kept")
    async with AsyncTestClient(app=make_app(routing_settings)) as first:
        assert (await set_alias(first, alias, "gpt-4o-mini")).status_code == 201
    async with AsyncTestClient(app=make_app(routing_settings)) as second:
        assert resources_of(second).alias_table.resolve(alias) == "gpt-4o-mini"
        assert (await all_aliases(second))[alias] == "gpt-4o-mini"


async def test_an_alias_set_on_one_replica_applies_on_the_other(
    routing_pg_settings: Settings, make_app: AppFactory
) -> None:
    alias = unique_alias("shared")
    app_a, app_b = make_app(routing_pg_settings), make_app(routing_pg_settings)
    async with (
        live_server(app_a) as url_a,
        live_server(app_b),
        httpx.AsyncClient(base_url=url_a) as a,
    ):
        table_b = app_b.state.resources.alias_table
        assert (await set_alias(a, alias, "target-1")).status_code == 201

        async def resolved(target: str) -> bool:
            return bool(table_b.resolve(alias) == target)

        await eventually(lambda: resolved("target-1"), within=5.0)
        assert (await set_alias(a, alias, "target-2")).status_code == 201
        await eventually(lambda: resolved("target-2"), within=5.0)
        assert (await a.delete(f"/api/admin/aliases/{alias}", headers=ADMIN)).status_code == 204

        async def gone() -> bool:
            return alias not in table_b

        await eventually(gone, within=5.0)


async def test_an_alias_with_a_slash_can_be_deleted(admin_client: Client) -> None:
    alias = f"org-{uuid.uuid4().hex[:6]}/model"
    assert (await set_alias(admin_client, alias, "llama3:latest")).status_code == 201
    assert resources_of(admin_client).alias_table.resolve(alias) == "llama3:latest"
    deleted = await admin_client.delete(f"/api/admin/aliases/{alias}", headers=ADMIN)
    assert deleted.status_code == 204, deleted.text
    assert alias not in resources_of(admin_client).alias_table
    assert (await set_alias(admin_client, alias, "m")).status_code == 201
    encoded = alias.replace("/", "%2F")
    deleted = await admin_client.delete(f"/api/admin/aliases/{encoded}", headers=ADMIN)
    assert deleted.status_code == 204, deleted.text
    assert_error(
        await admin_client.delete(f"/api/admin/aliases/{alias}", headers=ADMIN),
        404,
        "alias_not_found",
    )
