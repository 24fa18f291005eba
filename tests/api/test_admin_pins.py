"""Sticky fallback pins: the service the runtime chat pins with, and the admin API.

Pins are global to the platform; the admin list is shared by every test on the
database, so these tests look at their own conversations' pins within it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from uuid import UUID

import pytest

from app.domain.conversations.pins import FallbackPinService
from tests.support.api import Client, set_user_flags, settings_of, user_with_id
from tests.support.conversations import (
    ADMIN,
    MISSING,
    RUNTIME_BASE,
    Tenant,
    both_client,
    create_conversation,
    db_config,
    make_profile,
    new_tenant,
    pg_client,
)
from tests.support.helpers import assert_error

__all__ = ["both_client", "pg_client"]

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")
PIN_FIELDS = {
    "conversationId",
    "projectId",
    "fromProfileId",
    "toProfileId",
    "reason",
    "backend",
    "createdAt",
}
PIN_SUMMARY_FIELDS = {"fromProfileId", "toProfileId", "reason", "backend", "createdAt"}


async def pin(
    client: Client,
    conversation_id: str,
    project_id: str,
    to_profile: str = "fallback",
    reason: str = "upstream_dropped",
    backend: str | None = "vllm-a",
) -> bool:
    async with db_config(client) as config, FallbackPinService.new(config=config) as pins:
        return await pins.pin_fallback(
            UUID(conversation_id), UUID(project_id), "primary", to_profile, reason, backend
        )


async def pins_of(client: Client, conversation_ids: set[str]) -> list[dict[str, Any]]:
    """The admin list (newest first), narrowed to these conversations."""
    response = await client.get("/api/admin/pins?limit=500", headers=ADMIN)
    assert response.status_code == 200, response.text
    return [p for p in response.json()["items"] if p["conversationId"] in conversation_ids]


async def conversation(client: Client, tenant: Tenant, cid: str) -> dict[str, Any]:
    response = await client.get(f"{RUNTIME_BASE}/{cid}", headers=tenant.runtime)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_pin_shows_in_the_conversation_and_the_admin_list(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    fallback = await make_profile(client)
    cid = (await create_conversation(client, RUNTIME_BASE, tenant.runtime))["id"]
    assert await pin(client, cid, tenant.project_id, fallback, "client_disconnected", None)

    shown = (await conversation(client, tenant, cid))["fallbackPin"]
    assert set(shown) == PIN_SUMMARY_FIELDS
    assert (shown["fromProfileId"], shown["toProfileId"]) == ("primary", fallback)
    assert (shown["reason"], shown["backend"]) == ("client_disconnected", None)
    assert ISO_UTC.match(shown["createdAt"])
    via_project = await client.get(f"{tenant.base}/{cid}", headers=tenant.owner)
    assert via_project.json()["fallbackPin"] == shown
    listed = (await client.get(RUNTIME_BASE, headers=tenant.runtime)).json()["items"]
    assert listed[0]["fallbackPin"] == shown

    [item] = await pins_of(client, {cid})
    assert set(item) == PIN_FIELDS
    assert item == {
        "conversationId": cid,
        "projectId": tenant.project_id,
        "fromProfileId": "primary",
        "toProfileId": fallback,
        "reason": "client_disconnected",
        "backend": None,
        "createdAt": shown["createdAt"],
    }

    cleared = await client.delete(f"/api/admin/pins/{cid}", headers=ADMIN)
    assert cleared.status_code == 204, cleared.text
    assert (await conversation(client, tenant, cid))["fallbackPin"] is None
    assert await pins_of(client, {cid}) == []
    again = await client.delete(f"/api/admin/pins/{cid}", headers=ADMIN)
    assert_error(again, 404, "pin_not_found")
    assert_error(await client.delete(f"/api/admin/pins/{MISSING}", headers=ADMIN), 404)
    assert_error(await client.delete("/api/admin/pins/not-a-uuid", headers=ADMIN), 404)
    # Cleared, the conversation may be pinned again.
    assert await pin(client, cid, tenant.project_id)


async def test_the_first_pin_wins(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    cid = (await create_conversation(client, RUNTIME_BASE, tenant.runtime))["id"]
    assert await pin(client, cid, tenant.project_id, "first") is True
    assert await pin(client, cid, tenant.project_id, "second", "client_disconnected") is False
    shown = (await conversation(client, tenant, cid))["fallbackPin"]
    assert (shown["toProfileId"], shown["reason"]) == ("first", "upstream_dropped")


async def test_concurrent_duplicate_pins_leave_one_and_never_fail(pg_client: Client) -> None:
    tenant = await new_tenant(pg_client)
    cid = (await create_conversation(pg_client, RUNTIME_BASE, tenant.runtime))["id"]
    async with db_config(pg_client) as config:

        async def one(n: int) -> bool:
            async with FallbackPinService.new(config=config) as pins:
                return await pins.pin_fallback(
                    UUID(cid),
                    UUID(tenant.project_id),
                    "primary",
                    f"to-{n}",
                    "upstream_dropped",
                    None,
                )

        results = await asyncio.gather(*(one(n) for n in range(12)))
    assert results.count(True) == 1
    [item] = await pins_of(pg_client, {cid})
    assert item["toProfileId"] == f"to-{results.index(True)}"


async def test_pins_for_missing_or_foreign_conversations_are_not_created(
    both_client: Client,
) -> None:
    client = both_client
    alice, bob = await new_tenant(client), await new_tenant(client)
    cid = (await create_conversation(client, RUNTIME_BASE, alice.runtime))["id"]
    assert await pin(client, cid, bob.project_id) is False
    assert await pin(client, MISSING, alice.project_id) is False
    assert (await conversation(client, alice, cid))["fallbackPin"] is None
    async with db_config(client) as config, FallbackPinService.new(config=config) as pins:
        with pytest.raises(ValueError, match="reason"):
            await pins.pin_fallback(UUID(cid), UUID(alice.project_id), "a", "b", "bored", None)
        assert await pins.get_pin(UUID(cid)) is None


async def test_deleting_a_conversation_removes_its_pin(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    cid = (await create_conversation(client, RUNTIME_BASE, tenant.runtime))["id"]
    assert await pin(client, cid, tenant.project_id)
    # A fork does not inherit the pin: it is a new conversation.
    fork = await client.post(f"{RUNTIME_BASE}/{cid}/fork", headers=tenant.runtime)
    assert fork.json()["fallbackPin"] is None
    assert len(await pins_of(client, {cid})) == 1
    deleted = await client.delete(f"{tenant.base}/{cid}", headers=tenant.owner)
    assert deleted.status_code == 204
    assert await pins_of(client, {cid}) == []
    async with db_config(client) as config, FallbackPinService.new(config=config) as pins:
        assert await pins.get_pin(UUID(cid)) is None
    assert_error(await client.delete(f"/api/admin/pins/{cid}", headers=ADMIN), 404, "pin_not_found")


async def test_the_admin_list_is_newest_first_and_paginated(pg_client: Client) -> None:
    tenant = await new_tenant(pg_client)
    ids = []
    for _ in range(3):
        cid = (await create_conversation(pg_client, RUNTIME_BASE, tenant.runtime))["id"]
        assert await pin(pg_client, cid, tenant.project_id)
        ids.append(cid)
    listed = await pins_of(pg_client, set(ids))
    assert [p["conversationId"] for p in listed] == list(reversed(ids))
    everything = (await pg_client.get("/api/admin/pins?limit=500", headers=ADMIN)).json()
    assert set(everything) == {"items", "total", "limit", "offset"}
    total = everything["total"]
    assert total >= 3
    # Ours are the newest pins: the first page of two holds the last two.
    page = (await pg_client.get("/api/admin/pins?limit=2&offset=0", headers=ADMIN)).json()
    assert [p["conversationId"] for p in page["items"]] == [ids[2], ids[1]]
    assert (page["total"], page["limit"], page["offset"]) == (total, 2, 0)
    page = (await pg_client.get("/api/admin/pins?limit=2&offset=2", headers=ADMIN)).json()
    assert page["items"][0]["conversationId"] == ids[0]
    assert_error(await pg_client.get("/api/admin/pins?limit=0", headers=ADMIN), 400)


async def test_only_platform_admins_reach_the_pins_api(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    cid = (await create_conversation(client, RUNTIME_BASE, tenant.runtime))["id"]
    assert await pin(client, cid, tenant.project_id)
    _, user, user_id = await user_with_id(client, "plain")
    for headers, status, code in [
        ({}, 401, "missing_credentials"),
        (user, 403, "admin_required"),
        (tenant.owner, 403, "admin_required"),
        (tenant.key, 403, "admin_required"),
        (tenant.runtime, 403, "admin_required"),
    ]:
        assert_error(await client.get("/api/admin/pins", headers=headers), status, code)
        response = await client.delete(f"/api/admin/pins/{cid}", headers=headers)
        assert_error(response, status, code)
    assert len(await pins_of(client, {cid})) == 1
    # A user made platform admin may list and clear.
    await set_user_flags(settings_of(client), user_id, is_admin=True)
    assert (await client.get("/api/admin/pins", headers=user)).status_code == 200
    assert (await client.delete(f"/api/admin/pins/{cid}", headers=user)).status_code == 204
