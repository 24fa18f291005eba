"""Conversations API on both route sets, and the service API the runtime chat uses.

The runtime routes (``/api/runtime/conversations``, runtime JWT) and the Projects API
routes (``/api/projects/{projectId}/conversations``) are one implementation: most
tests run their scenario on both. Another tenant's conversation is a 404 on every
route, exactly like one that does not exist.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any
from uuid import UUID

import pytest

from app.domain.conversations.messages import (
    NewMessage,
    messages_from_openai,
    validate_messages,
)
from app.domain.conversations.pins import FallbackPinService
from app.domain.conversations.schemas import MessageIn
from app.domain.conversations.services import ConversationService
from app.lib.errors import BadRequestError, NotFoundError
from tests.support.api import Client, user_with_id
from tests.support.conversations import (
    ADMIN,
    CONVERSATION_FIELDS,
    MESSAGE_FIELDS,
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
SEED: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?", "name": "ann"},
    {
        "role": "assistant",
        "content": None,
        "toolCalls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 21}', "toolCallId": "call_1"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "And this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ],
    },
]


def route_sets(tenant: Tenant) -> list[tuple[str, dict[str, str]]]:
    """(base path, headers) of each route set, as a writer of the tenant's project."""
    return [(RUNTIME_BASE, tenant.runtime), (tenant.base, tenant.owner)]


async def all_messages(client: Client, base: str, headers: dict[str, str], cid: str) -> Any:
    response = await client.get(f"{base}/{cid}/messages?limit=500", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


# ------------------------------------------------------------------- lifecycle


async def test_create_get_patch_fork_delete_on_both_route_sets(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    profile = await make_profile(client)
    for base, headers in route_sets(tenant):
        created = await create_conversation(
            client, base, headers, title="  Trip  ", modelProfileId=profile, priority=True
        )
        assert set(created) == CONVERSATION_FIELDS
        assert created["projectId"] == tenant.project_id
        assert created["title"] == "Trip"
        assert created["modelProfileId"] == profile
        assert created["priority"] is True
        assert created["forkedFromId"] is None
        assert created["messageCount"] == 0
        assert created["fallbackPin"] is None
        assert ISO_UTC.match(created["createdAt"])
        assert ISO_UTC.match(created["updatedAt"])
        cid = created["id"]

        got = await client.get(f"{base}/{cid}", headers=headers)
        assert got.status_code == 200, got.text
        assert got.json() == created

        patched = await client.patch(
            f"{base}/{cid}", json={"title": "Holiday", "priority": False}, headers=headers
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["title"] == "Holiday"
        assert patched.json()["priority"] is False
        assert patched.json()["modelProfileId"] == profile  # untouched
        assert patched.json()["updatedAt"] >= created["updatedAt"]

        fork = await client.post(f"{base}/{cid}/fork", headers=headers)
        assert fork.status_code == 201, fork.text
        forked = fork.json()
        assert forked["forkedFromId"] == cid
        assert forked["id"] != cid
        assert (forked["title"], forked["modelProfileId"], forked["priority"]) == (
            "Holiday",
            profile,
            False,
        )

        deleted = await client.delete(f"{base}/{cid}", headers=headers)
        assert deleted.status_code == 204, deleted.text
        assert_error(
            await client.get(f"{base}/{cid}", headers=headers), 404, "conversation_not_found"
        )
        assert_error(
            await client.delete(f"{base}/{cid}", headers=headers), 404, "conversation_not_found"
        )
        # The fork outlives its source.
        survivor = await client.get(f"{base}/{forked['id']}", headers=headers)
        assert survivor.status_code == 200
        assert survivor.json()["forkedFromId"] == cid


async def test_both_route_sets_see_the_same_conversations(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    via_runtime = await create_conversation(client, RUNTIME_BASE, tenant.runtime, title="r")
    via_project = await create_conversation(client, tenant.base, tenant.key, title="k")
    for base, headers in route_sets(tenant):
        listed = (await client.get(base, headers=headers)).json()
        assert [c["id"] for c in listed["items"]] == [via_project["id"], via_runtime["id"]]
    got = await client.get(f"{RUNTIME_BASE}/{via_project['id']}", headers=tenant.runtime)
    assert got.json() == via_project


async def test_an_empty_body_creates_a_default_conversation(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    created = await create_conversation(both_client, RUNTIME_BASE, tenant.runtime)
    assert (created["title"], created["modelProfileId"], created["priority"]) == ("", None, False)
    assert_error(
        await both_client.post(RUNTIME_BASE, json={"colour": "red"}, headers=tenant.runtime),
        400,
    )
    assert_error(
        await both_client.post(RUNTIME_BASE, json={"title": "x" * 201}, headers=tenant.runtime),
        400,
    )


# ----------------------------------------------------------- profile selection


@pytest.mark.parametrize("field", ["modelProfileId", "llmId", "provider"])
async def test_each_profile_field_selects_the_profile(pg_client: Client, field: str) -> None:
    tenant = await new_tenant(pg_client)
    first, second = await make_profile(pg_client), await make_profile(pg_client)
    for base, headers in route_sets(tenant):
        created = await create_conversation(pg_client, base, headers, **{field: first})
        assert created["modelProfileId"] == first
        cid = created["id"]
        patched = await pg_client.patch(f"{base}/{cid}", json={field: second}, headers=headers)
        assert patched.json()["modelProfileId"] == second
        fork = await pg_client.post(f"{base}/{cid}/fork", json={field: first}, headers=headers)
        assert fork.status_code == 201, fork.text
        assert fork.json()["modelProfileId"] == first
        cleared = await pg_client.patch(f"{base}/{cid}", json={field: None}, headers=headers)
        assert cleared.json()["modelProfileId"] is None


async def test_profile_fields_may_repeat_a_value_but_not_conflict(pg_client: Client) -> None:
    tenant = await new_tenant(pg_client)
    first, second = await make_profile(pg_client), await make_profile(pg_client)
    same = {"modelProfileId": first, "llmId": first, "provider": first}
    created = await create_conversation(pg_client, RUNTIME_BASE, tenant.runtime, **same)
    assert created["modelProfileId"] == first
    cid = created["id"]
    url = f"{RUNTIME_BASE}/{cid}"
    conflicts = [
        {"modelProfileId": first, "llmId": second},
        {"llmId": first, "provider": second},
        {"modelProfileId": first, "llmId": first, "provider": second},
    ]
    for body in conflicts:
        for method, target in (("POST", RUNTIME_BASE), ("PATCH", url), ("POST", f"{url}/fork")):
            response = await pg_client.request(method, target, json=body, headers=tenant.runtime)
            error = assert_error(response, 400, "conflicting_profile_fields")
            assert error["param"] in ("llmId", "provider")
    # On a patch, null is a value: null against a profile is a conflict too.
    response = await pg_client.patch(
        url, json={"modelProfileId": None, "provider": first}, headers=tenant.runtime
    )
    assert_error(response, 400, "conflicting_profile_fields")
    # On create and fork, null is "not given".
    created = await create_conversation(
        pg_client, RUNTIME_BASE, tenant.runtime, modelProfileId=None, llmId=second
    )
    assert created["modelProfileId"] == second
    unchanged = (await pg_client.get(url, headers=tenant.runtime)).json()
    assert unchanged["modelProfileId"] == first


async def test_unknown_and_disabled_profiles_are_refused(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    disabled = await make_profile(client, enabled=False)
    cid = (await create_conversation(client, RUNTIME_BASE, tenant.runtime))["id"]
    url = f"{RUNTIME_BASE}/{cid}"
    for field in ("modelProfileId", "llmId", "provider"):
        for method, target in (("POST", RUNTIME_BASE), ("PATCH", url), ("POST", f"{url}/fork")):
            unknown = await client.request(
                method, target, json={field: "no-such-profile"}, headers=tenant.runtime
            )
            assert assert_error(unknown, 404, "profile_not_found")["param"] == field
            off = await client.request(
                method, target, json={field: disabled}, headers=tenant.runtime
            )
            assert assert_error(off, 400, "profile_disabled")["param"] == field
    listed = (await client.get(RUNTIME_BASE, headers=tenant.runtime)).json()
    assert listed["total"] == 1  # nothing was created by the refused calls


# -------------------------------------------------------------------- messages


async def test_seeded_history_is_listed_oldest_first_and_paginated(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    for base, headers in route_sets(tenant):
        created = await create_conversation(client, base, headers, messages=SEED)
        assert created["messageCount"] == len(SEED)
        cid = created["id"]
        listed = await all_messages(client, base, headers, cid)
        assert listed["total"] == len(SEED)
        items = listed["items"]
        assert [m["seq"] for m in items] == [1, 2, 3, 4, 5]
        assert all(set(m) == MESSAGE_FIELDS for m in items)
        assert [m["role"] for m in items] == [m["role"] for m in SEED]
        assert items[1]["name"] == "ann"
        assert items[2]["content"] is None
        assert items[2]["toolCalls"] == SEED[2]["toolCalls"]
        assert items[3]["toolCallId"] == "call_1"
        assert items[4]["content"] == SEED[4]["content"]
        assert all(m["modelProfileId"] is None and m["backend"] is None for m in items)
        assert all(m["promptTokens"] is None for m in items)
        page = await client.get(f"{base}/{cid}/messages?limit=2&offset=2", headers=headers)
        body = page.json()
        assert (body["total"], body["limit"], body["offset"]) == (5, 2, 2)
        assert [m["seq"] for m in body["items"]] == [3, 4]
        assert_error(await client.get(f"{base}/{cid}/messages?limit=0", headers=headers), 400)
        assert_error(await client.get(f"{base}/{cid}/messages?offset=-1", headers=headers), 400)


BAD_MESSAGES: list[tuple[dict[str, Any], str, str]] = [
    ({"content": "hi"}, "invalid_request", "messages[0]"),
    ({"role": "robot", "content": "hi"}, "invalid_role", "messages[0].role"),
    ({"role": "user"}, "missing_content", "messages[0].content"),
    ({"role": "user", "content": None}, "missing_content", "messages[0].content"),
    ({"role": "assistant", "content": None}, "missing_content", "messages[0].content"),
    ({"role": "tool", "content": "42"}, "missing_tool_call_id", "messages[0].toolCallId"),
    (
        {"role": "user", "content": "x", "toolCallId": "c"},
        "invalid_tool_call_id",
        "messages[0].toolCallId",
    ),
    (
        {"role": "user", "content": "x", "toolCalls": []},
        "invalid_tool_calls",
        "messages[0].toolCalls",
    ),
    ({"role": "assistant", "toolCalls": []}, "invalid_tool_calls", "messages[0].toolCalls"),
    (
        {"role": "assistant", "toolCalls": [{"id": "c", "type": "function"}]},
        "invalid_tool_calls",
        "messages[0].toolCalls[0]",
    ),
    ({"role": "user", "content": []}, "invalid_content", "messages[0].content"),
    ({"role": "user", "content": ["hi"]}, "invalid_content", "messages[0].content[0]"),
    (
        {"role": "user", "content": [{"type": "text"}]},
        "invalid_content",
        "messages[0].content[0].text",
    ),
    (
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
        "invalid_content",
        "messages[0].content[0].image_url",
    ),
    ({"role": "user", "content": 42}, "invalid_request", "messages[0].content"),
    ({"role": "user", "content": "x", "tool_call_id": "c"}, "invalid_request", "tool_call_id"),
]


async def test_bad_messages_are_400_naming_the_field(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    for message, code, param in BAD_MESSAGES:
        body = {"messages": [message]}
        response = await both_client.post(RUNTIME_BASE, json=body, headers=tenant.runtime)
        error = assert_error(response, 400, code)
        if code != "invalid_request":
            assert error["param"] == param, (message, error)
        else:
            # msgspec's own checks: the field is named in the param or the message.
            assert param.split(".")[-1] in f"{error['param']} {error['message']}", error
    # The index points at the offending message.
    body = {"messages": [{"role": "user", "content": "ok"}, {"role": "user"}]}
    response = await both_client.post(RUNTIME_BASE, json=body, headers=tenant.runtime)
    assert assert_error(response, 400, "missing_content")["param"] == "messages[1].content"
    listed = (await both_client.get(RUNTIME_BASE, headers=tenant.runtime)).json()
    assert listed["total"] == 0


# ------------------------------------------------------------------------ fork


async def test_fork_copies_history_up_to_a_message(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    profile = await make_profile(client)
    for base, headers in route_sets(tenant):
        source = await create_conversation(
            client, base, headers, title="src", messages=SEED, priority=True, llmId=profile
        )
        messages = (await all_messages(client, base, headers, source["id"]))["items"]
        third = messages[2]
        response = await client.post(
            f"{base}/{source['id']}/fork",
            json={"upToMessageId": third["id"], "title": "branch", "priority": False},
            headers=headers,
        )
        assert response.status_code == 201, response.text
        fork = response.json()
        assert fork["forkedFromId"] == source["id"]
        assert (fork["title"], fork["priority"], fork["modelProfileId"]) == (
            "branch",
            False,
            profile,
        )
        assert fork["messageCount"] == 3
        copied = (await all_messages(client, base, headers, fork["id"]))["items"]
        assert [m["seq"] for m in copied] == [1, 2, 3]
        keep = ("role", "content", "name", "toolCalls", "toolCallId", "createdAt")
        assert [{k: m[k] for k in keep} for m in copied] == [
            {k: m[k] for k in keep} for m in messages[:3]
        ]
        assert not {m["id"] for m in copied} & {m["id"] for m in messages}
        # The source is untouched.
        again = (await all_messages(client, base, headers, source["id"]))["items"]
        assert again == messages
        # Priority is copied when not given; a fork of a fork works.
        second = await client.post(f"{base}/{fork['id']}/fork", json={}, headers=headers)
        assert second.status_code == 201
        assert (second.json()["priority"], second.json()["messageCount"]) == (False, 3)
        whole = await client.post(f"{base}/{source['id']}/fork", headers=headers)
        assert (whole.json()["priority"], whole.json()["messageCount"]) == (True, len(SEED))


async def test_fork_refuses_a_message_of_another_conversation(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    other_tenant = await new_tenant(client)
    source = await create_conversation(client, RUNTIME_BASE, tenant.runtime, messages=SEED[:2])
    sibling = await create_conversation(client, RUNTIME_BASE, tenant.runtime, messages=SEED[:2])
    foreign = await create_conversation(
        client, RUNTIME_BASE, other_tenant.runtime, messages=SEED[:2]
    )
    sibling_msg = (await all_messages(client, RUNTIME_BASE, tenant.runtime, sibling["id"]))[
        "items"
    ][0]["id"]
    foreign_msg = (await all_messages(client, RUNTIME_BASE, other_tenant.runtime, foreign["id"]))[
        "items"
    ][0]["id"]
    for message_id in (sibling_msg, foreign_msg, MISSING):
        response = await client.post(
            f"{RUNTIME_BASE}/{source['id']}/fork",
            json={"upToMessageId": message_id},
            headers=tenant.runtime,
        )
        error = assert_error(response, 400, "message_not_in_conversation")
        assert error["param"] == "upToMessageId"
    bad = await client.post(
        f"{RUNTIME_BASE}/{source['id']}/fork",
        json={"upToMessageId": "not-a-uuid"},
        headers=tenant.runtime,
    )
    assert_error(bad, 400)
    assert (await client.get(RUNTIME_BASE, headers=tenant.runtime)).json()["total"] == 2


# --------------------------------------------------------------------- tenancy


def every_route(base: str, cid: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", f"{base}/{cid}", None),
        ("GET", f"{base}/{cid}/messages", None),
        ("PATCH", f"{base}/{cid}", {"title": "stolen"}),
        ("POST", f"{base}/{cid}/fork", {}),
        ("DELETE", f"{base}/{cid}", None),
    ]


async def test_another_projects_conversation_is_404_on_every_route(both_client: Client) -> None:
    client = both_client
    alice, bob = await new_tenant(client), await new_tenant(client)
    theirs = await create_conversation(client, RUNTIME_BASE, alice.runtime, messages=SEED[:2])
    cid = theirs["id"]
    # Bob's runtime token and Bob as owner of his own project: as if it did not exist.
    for base, headers in [*route_sets(bob), (bob.base, bob.key)]:
        for method, url, body in every_route(base, cid):
            response = await client.request(method, url, json=body, headers=headers)
            assert_error(response, 404, "conversation_not_found")
        for method, url, body in every_route(base, MISSING):
            response = await client.request(method, url, json=body, headers=headers)
            assert_error(response, 404, "conversation_not_found")
        listed = (await client.get(base, headers=headers)).json()
        assert cid not in {c["id"] for c in listed["items"]}
    # Bob on Alice's project path: the project itself is hidden.
    for headers in (bob.owner, bob.key):
        for method, url, body in every_route(alice.base, cid):
            response = await client.request(method, url, json=body, headers=headers)
            assert_error(response, 404, "project_not_found")
        assert_error(await client.get(alice.base, headers=headers), 404, "project_not_found")
        create = await client.post(alice.base, json={}, headers=headers)
        assert_error(create, 404, "project_not_found")
    # Malformed ids do not match a route: 404, in the error shape.
    for base, headers in route_sets(alice):
        assert_error(await client.get(f"{base}/not-a-uuid", headers=headers), 404)
        assert_error(await client.get(f"{base}/not-a-uuid/messages", headers=headers), 404)
    assert_error(await client.get("/api/projects/nope/conversations", headers=alice.owner), 404)
    # Alice's conversation is intact.
    kept = await client.get(f"{RUNTIME_BASE}/{cid}", headers=alice.runtime)
    assert kept.status_code == 200
    assert (kept.json()["title"], kept.json()["messageCount"]) == ("", 2)


async def test_members_read_and_writers_write(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    member_email, member, _ = await user_with_id(client, "member")
    added = await client.post(
        f"/api/projects/{tenant.project_id}/members",
        json={"email": member_email},
        headers=tenant.owner,
    )
    assert added.status_code == 201, added.text
    cid = (await create_conversation(client, tenant.base, tenant.owner, messages=SEED[:1]))["id"]
    url = f"{tenant.base}/{cid}"
    # A member reads everything...
    assert (await client.get(tenant.base, headers=member)).json()["total"] == 1
    assert (await client.get(url, headers=member)).status_code == 200
    assert (await client.get(f"{url}/messages", headers=member)).json()["total"] == 1
    # ...and writes nothing.
    for method, target, body in [
        ("POST", tenant.base, {}),
        ("PATCH", url, {"title": "x"}),
        ("POST", f"{url}/fork", {}),
        ("DELETE", url, None),
    ]:
        response = await client.request(method, target, json=body, headers=member)
        assert_error(response, 403, "insufficient_role")
    # The project's API key writes, like the owner.
    patched = await client.patch(url, json={"title": "by key"}, headers=tenant.key)
    assert patched.json()["title"] == "by key"
    # A platform admin who is not a member reads and writes too.
    assert (await client.get(url, headers=ADMIN)).status_code == 200
    assert (await client.delete(url, headers=ADMIN)).status_code == 204


async def test_each_route_set_takes_its_own_credentials(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    cid = (await create_conversation(client, RUNTIME_BASE, tenant.runtime))["id"]
    for headers in (tenant.owner, tenant.key):
        for method, url, body in every_route(RUNTIME_BASE, cid):
            response = await client.request(method, url, json=body, headers=headers)
            assert_error(response, 403, "runtime_token_required")
    for method, url, body in every_route(tenant.base, cid):
        response = await client.request(method, url, json=body, headers=tenant.runtime)
        assert_error(response, 403, "runtime_token_not_allowed")
        assert_error(await client.request(method, url, json=body), 401, "missing_credentials")
    assert_error(await client.get(RUNTIME_BASE), 401, "missing_credentials")


# ------------------------------------------------------------------------ list


async def test_list_is_newest_first_paginated_and_filters_priority(both_client: Client) -> None:
    client = both_client
    tenant = await new_tenant(client)
    ids = []
    for n in range(5):
        created = await create_conversation(
            client, RUNTIME_BASE, tenant.runtime, title=f"c{n}", priority=n % 2 == 1
        )
        ids.append(created["id"])
    newest_first = list(reversed(ids))
    for base, headers in route_sets(tenant):
        everything = (await client.get(base, headers=headers)).json()
        assert set(everything) == {"items", "total", "limit", "offset"}
        assert [c["id"] for c in everything["items"]] == newest_first
        assert (everything["total"], everything["limit"], everything["offset"]) == (5, 50, 0)
        page = (await client.get(f"{base}?limit=2&offset=1", headers=headers)).json()
        assert [c["id"] for c in page["items"]] == newest_first[1:3]
        assert (page["total"], page["limit"], page["offset"]) == (5, 2, 1)
        urgent = (await client.get(f"{base}?priority=true", headers=headers)).json()
        assert [c["id"] for c in urgent["items"]] == [ids[3], ids[1]]
        assert urgent["total"] == 2
        calm = (await client.get(f"{base}?priority=false", headers=headers)).json()
        assert [c["id"] for c in calm["items"]] == [ids[4], ids[2], ids[0]]
        assert_error(await client.get(f"{base}?limit=501", headers=headers), 400)


# ------------------------------------------------------- the chat service API


async def test_load_for_chat_gives_openai_history_and_pin(both_client: Client) -> None:
    client = both_client
    tenant, other = await new_tenant(client), await new_tenant(client)
    profile, fallback = await make_profile(client), await make_profile(client)
    created = await create_conversation(
        client, RUNTIME_BASE, tenant.runtime, messages=SEED, modelProfileId=profile
    )
    cid, pid = UUID(created["id"]), UUID(tenant.project_id)
    async with db_config(client) as config:
        async with ConversationService.new(config=config) as service:
            ctx = await service.load_for_chat(pid, cid)
            assert ctx.pin is None
            assert ctx.conversation.model_profile_id == profile
            assert ctx.messages == [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Weather in Paris?", "name": "ann"},
                {"role": "assistant", "content": None, "tool_calls": SEED[2]["toolCalls"]},
                {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
                {"role": "user", "content": SEED[4]["content"]},
            ]
            with pytest.raises(NotFoundError) as missing:
                await service.load_for_chat(UUID(other.project_id), cid)
            assert missing.value.code == "conversation_not_found"
            with pytest.raises(NotFoundError):
                await service.load_for_chat(pid, uuid.uuid4())
            # The turn, then the answer, as the runtime chat stores them.
            # OpenAI dicts are checked on the way in (nothing is stored on a 400).
            with pytest.raises(BadRequestError) as bad:
                await service.append_user_turns(cid, [{"role": "user"}])
            assert bad.value.code == "missing_content"
            await service.append_user_turns(cid, [{"role": "user", "content": "Thanks!"}])
            await service.append_assistant(
                cid,
                content="You're welcome.",
                tool_calls=None,
                profile_id=profile,
                backend="vllm-a",
                prompt_tokens=40,
                completion_tokens=4,
            )
            # Detached: still readable after the session moved on.
            assert ctx.conversation.id == cid
        async with FallbackPinService.new(config=config) as pins:
            assert await pins.pin_fallback(cid, pid, profile, fallback, "upstream_dropped", "b1")
        async with ConversationService.new(config=config) as service:
            ctx = await service.load_for_chat(pid, cid)
            assert ctx.pin is not None
            assert (ctx.pin.from_profile_id, ctx.pin.to_profile_id) == (profile, fallback)
            assert ctx.messages[-2:] == [
                {"role": "user", "content": "Thanks!"},
                {"role": "assistant", "content": "You're welcome."},
            ]
            assert ctx.conversation.message_count == len(SEED) + 2
            with pytest.raises(NotFoundError):
                await service.append_user_turns(uuid.uuid4(), [NewMessage("user", "hi")])
    listed = (await all_messages(client, RUNTIME_BASE, tenant.runtime, created["id"]))["items"]
    answer = listed[-1]
    assert (answer["seq"], answer["role"], answer["modelProfileId"], answer["backend"]) == (
        len(SEED) + 2,
        "assistant",
        profile,
        "vllm-a",
    )
    assert (answer["promptTokens"], answer["completionTokens"]) == (40, 4)
    assert listed[-2]["modelProfileId"] is None


def test_message_in_converts_to_openai_shape() -> None:
    message = MessageIn(role="tool", content="42", tool_call_id="call_1")
    assert message.to_openai() == {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    [checked] = validate_messages([message])
    assert checked == NewMessage(role="tool", content="42", tool_call_id="call_1")


def test_messages_from_openai_validates_snake_case_dicts() -> None:
    ok = messages_from_openai(
        [
            {"role": "assistant", "content": None, "tool_calls": SEED[2]["toolCalls"]},
            {"role": "tool", "content": "1", "tool_call_id": "call_1"},
        ]
    )
    assert ok[0] == NewMessage(role="assistant", content=None, tool_calls=SEED[2]["toolCalls"])
    assert ok[1].tool_call_id == "call_1"
    cases: list[tuple[Any, str, str]] = [
        ([{"role": "tool", "content": "1"}], "missing_tool_call_id", "messages[0].tool_call_id"),
        ([{"content": "1"}], "invalid_role", "messages[0].role"),
        ([{"role": "user", "content": 1}], "invalid_content", "messages[0].content"),
        ([{"role": "user", "content": "x", "toolCalls": []}], "invalid_message", "messages[0]"),
        (["hello"], "invalid_message", "messages[0]"),
    ]
    for items, code, param in cases:
        with pytest.raises(BadRequestError) as caught:
            messages_from_openai(items)
        assert (caught.value.code, caught.value.param) == (code, param)


async def test_concurrent_appends_keep_seq_unique_and_gap_free(both_client: Client) -> None:
    """PostgreSQL: the conversation row lock queues the appends. SQLite: one writer."""
    tenant = await new_tenant(both_client)
    created = await create_conversation(
        both_client, RUNTIME_BASE, tenant.runtime, messages=SEED[:1]
    )
    cid = UUID(created["id"])
    writers = 24

    async with db_config(both_client) as config:

        async def user_turns(n: int) -> None:
            turns = [NewMessage(role="user", content=f"u{n}-a"), NewMessage("user", f"u{n}-b")]
            async with ConversationService.new(config=config) as service:
                # As the chat does: read the history, then append on the same session.
                await service.load_for_chat(UUID(tenant.project_id), cid)
                await service.append_user_turns(cid, turns)

        async def answer(n: int) -> None:
            async with ConversationService.new(config=config) as service:
                await service.append_assistant(cid, f"a{n}", None, None, "b", 1, 1)

        jobs = [user_turns(n) if n % 2 else answer(n) for n in range(writers)]
        await asyncio.gather(*jobs)

    expected = 1 + sum(2 if n % 2 else 1 for n in range(writers))
    listed = await all_messages(both_client, RUNTIME_BASE, tenant.runtime, created["id"])
    seqs = [m["seq"] for m in listed["items"]]
    assert seqs == list(range(1, expected + 1))
    assert listed["total"] == expected
    got = (await both_client.get(f"{RUNTIME_BASE}/{cid}", headers=tenant.runtime)).json()
    assert got["messageCount"] == expected
    # A request's turns stay together: each "-a" is followed by its "-b".
    contents = [m["content"] for m in listed["items"]]
    for i, content in enumerate(contents):
        if isinstance(content, str) and content.endswith("-a"):
            assert contents[i + 1] == content[:-1] + "b"
