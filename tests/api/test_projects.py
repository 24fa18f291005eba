"""Projects REST API: tenancy, members, roles, pagination, validation.

Every route is also exercised with another tenant's ids: a project (or an object in
it) the caller may not see is a 404, identical to one that does not exist.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from app.db.config import build_db_config
from app.db.migrate import upgrade
from app.domain.projects.services import ProjectService
from app.lib.errors import ConflictError
from tests.support.api import (
    Client,
    create_api_key,
    create_runtime_token,
    set_user_flags,
    settings_of,
    user_with_id,
)
from tests.support.helpers import assert_error, bearer, new_project, new_user, unique_email
from tests.support.settings import AppFactory, base_settings, with_settings

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")
PROJECT_FIELDS = {"id", "name", "slug", "ownerId", "role", "createdAt", "updatedAt"}
MEMBER_FIELDS = {"userId", "email", "name", "role", "addedAt"}
MISSING = "00000000-0000-4000-8000-000000000000"


def slug_of(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


async def create(client: Client, headers: dict[str, str], **body: Any) -> Any:
    return await client.post("/api/projects", json=body, headers=headers)


# ---------------------------------------------------------------- create / read


async def test_create_and_get_project(any_client: Client) -> None:
    _, headers, user_id = await user_with_id(any_client)
    slug = slug_of("acme")
    response = await create(any_client, headers, name="  Acme Corp  ", slug=slug)
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == PROJECT_FIELDS
    assert body["name"] == "Acme Corp"
    assert body["slug"] == slug
    assert body["ownerId"] == str(user_id)
    assert body["role"] == "owner"
    assert ISO_UTC.match(body["createdAt"])
    assert ISO_UTC.match(body["updatedAt"])
    uuid.UUID(body["id"])

    fetched = await any_client.get(f"/api/projects/{body['id']}", headers=headers)
    assert fetched.status_code == 200, fetched.text
    assert fetched.json() == body

    members = await any_client.get(f"/api/projects/{body['id']}/members", headers=headers)
    assert members.status_code == 200, members.text
    [owner] = members.json()["items"]
    assert owner["userId"] == str(user_id)
    assert owner["role"] == "owner"


async def test_slug_is_derived_from_the_name_and_kept_unique(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    tag = uuid.uuid4().hex[:8]
    first = await create(any_client, headers, name=f"Café Über {tag}!")
    assert first.status_code == 201, first.text
    assert first.json()["slug"] == f"caf-ber-{tag}"
    second = await create(any_client, headers, name=f"café   über {tag}")
    assert second.status_code == 201, second.text
    assert second.json()["slug"] == f"caf-ber-{tag}-2"
    explicit_null = await create(any_client, headers, name=f"Café Über {tag}", slug=None)
    assert explicit_null.status_code == 201, explicit_null.text
    assert explicit_null.json()["slug"] == f"caf-ber-{tag}-3"


async def test_a_name_without_letters_still_gets_a_valid_slug(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    response = await create(any_client, headers, name="日本語")
    assert response.status_code == 201, response.text
    assert re.match(r"^project(-\d+)?$", response.json()["slug"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "x", "bogus": 1}, "bogus"),
        ({"name": "x", "ownerId": MISSING}, "ownerId"),
        ({"name": 5}, "name"),
        ({"name": None}, "name"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 201}, "name"),
        ({}, "name"),
        ({"name": "x", "slug": "Bad Slug"}, "slug"),
        ({"name": "x", "slug": "UPPER"}, "slug"),
        ({"name": "x", "slug": "-lead"}, "slug"),
        ({"name": "x", "slug": "trail-"}, "slug"),
        ({"name": "x", "slug": "a" * 65}, "slug"),
        ({"name": "x", "slug": ""}, "slug"),
        ({"name": "x", "slug": 12}, "slug"),
    ],
)
async def test_create_rejects_invalid_bodies(
    any_client: Client, body: dict[str, Any], param: str
) -> None:
    _, headers = await new_user(any_client)
    response = await any_client.post("/api/projects", json=body, headers=headers)
    error = assert_error(response, 400)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("payload", [[], "a string", 3])
async def test_create_rejects_a_body_that_is_not_an_object(
    any_client: Client, payload: Any
) -> None:
    _, headers = await new_user(any_client)
    response = await any_client.post("/api/projects", json=payload, headers=headers)
    assert_error(response, 400)


async def test_create_rejects_malformed_json(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    response = await any_client.post(
        "/api/projects",
        content=b'{"name": ',
        headers={**headers, "content-type": "application/json"},
    )
    assert_error(response, 400)


async def test_the_longest_valid_slug_and_name_are_accepted(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    slug = uuid.uuid4().hex + "a" * 32
    assert len(slug) == 64
    response = await create(any_client, headers, name="n" * 200, slug=slug)
    assert response.status_code == 201, response.text


async def test_duplicate_slug_is_a_conflict_on_create(any_client: Client) -> None:
    _, alice = await new_user(any_client, "alice")
    _, bob = await new_user(any_client, "bob")
    slug = slug_of("dup")
    assert (await create(any_client, alice, name="A", slug=slug)).status_code == 201
    # Slugs are global: another tenant cannot take it either.
    for headers in (alice, bob):
        error = assert_error(await create(any_client, headers, name="B", slug=slug), 409)
        assert error["code"] == "slug_taken"
        assert error["param"] == "slug"
        assert error["type"] == "conflict_error"


async def test_concurrent_creates_with_one_slug_leave_one_winner(
    pg_settings: Any, make_app: AppFactory
) -> None:
    """Two creations racing past the existence check: the unique index decides, and
    the loser gets a 409, not a 500."""
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        _, _, owner_id = await user_with_id(client)
    db_config = build_db_config(pg_settings)
    slug = slug_of("race")

    async def attempt() -> str:
        async with ProjectService.new(config=db_config) as service:
            try:
                await service.create_owned(name="race", slug=slug, owner_id=owner_id)
            except ConflictError as exc:
                return exc.code
            return "created"

    try:
        outcomes = await asyncio.gather(*(attempt() for _ in range(4)))
    finally:
        await db_config.get_engine().dispose()
    assert sorted(outcomes) == ["created", "slug_taken", "slug_taken", "slug_taken"]


# ---------------------------------------------------------------------- update


async def test_patch_updates_only_the_given_fields(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    project = await new_project(any_client, headers, name="Before")
    url = f"/api/projects/{project['id']}"

    renamed = await any_client.patch(url, json={"name": " After "}, headers=headers)
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["name"] == "After"
    assert renamed.json()["slug"] == project["slug"]
    assert renamed.json()["role"] == "owner"

    new_slug = slug_of("moved")
    moved = await any_client.patch(url, json={"slug": new_slug}, headers=headers)
    assert moved.status_code == 200, moved.text
    assert moved.json()["slug"] == new_slug
    assert moved.json()["name"] == "After"

    unchanged = await any_client.patch(url, json={}, headers=headers)
    assert unchanged.status_code == 200, unchanged.text
    assert unchanged.json()["name"] == "After"
    assert unchanged.json()["slug"] == new_slug

    # The same slug again is not a conflict with itself.
    same = await any_client.patch(url, json={"slug": new_slug}, headers=headers)
    assert same.status_code == 200, same.text

    fetched = (await any_client.get(url, headers=headers)).json()
    assert fetched["name"] == "After"
    assert fetched["slug"] == new_slug

    # The old slug is free again.
    reuse = await create(any_client, headers, name="Reuse", slug=project["slug"])
    assert reuse.status_code == 201, reuse.text


async def test_duplicate_slug_is_a_conflict_on_patch(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    first = await new_project(any_client, headers)
    second = await new_project(any_client, headers)
    response = await any_client.patch(
        f"/api/projects/{second['id']}", json={"slug": first["slug"]}, headers=headers
    )
    error = assert_error(response, 409, "slug_taken")
    assert error["param"] == "slug"
    fetched = await any_client.get(f"/api/projects/{second['id']}", headers=headers)
    assert fetched.json()["slug"] == second["slug"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"bogus": True}, "bogus"),
        ({"ownerId": MISSING}, "ownerId"),
        ({"name": 1}, "name"),
        ({"name": ""}, "name"),
        ({"name": "  "}, "name"),
        ({"name": None}, "name"),
        ({"slug": "Not Valid"}, "slug"),
        ({"slug": None}, "slug"),
        ({"slug": ["a"]}, "slug"),
    ],
)
async def test_patch_rejects_invalid_bodies(
    any_client: Client, body: dict[str, Any], param: str
) -> None:
    _, headers = await new_user(any_client)
    project = await new_project(any_client, headers)
    response = await any_client.patch(f"/api/projects/{project['id']}", json=body, headers=headers)
    error = assert_error(response, 400)
    assert error["param"] == param, error


# ------------------------------------------------------------------ pagination


async def test_project_list_paginates(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    created = [(await new_project(any_client, headers, name=f"P{i}"))["id"] for i in range(5)]
    newest_first = list(reversed(created))

    everything = await any_client.get("/api/projects", headers=headers)
    assert everything.status_code == 200, everything.text
    body = everything.json()
    assert set(body) == {"items", "total", "limit", "offset"}
    assert body["total"] == 5
    assert body["limit"] == 50
    assert body["offset"] == 0
    assert [p["id"] for p in body["items"]] == newest_first
    assert all(set(p) == PROJECT_FIELDS and p["role"] == "owner" for p in body["items"])

    seen: list[str] = []
    for offset in (0, 2, 4):
        page = await any_client.get(f"/api/projects?limit=2&offset={offset}", headers=headers)
        assert page.status_code == 200, page.text
        data = page.json()
        assert data["total"] == 5
        assert data["limit"] == 2
        assert data["offset"] == offset
        seen += [p["id"] for p in data["items"]]
    assert seen == newest_first

    past_end = (await any_client.get("/api/projects?offset=10", headers=headers)).json()
    assert past_end == {"items": [], "total": 5, "limit": 50, "offset": 10}
    widest = await any_client.get("/api/projects?limit=500", headers=headers)
    assert widest.status_code == 200
    assert widest.json()["limit"] == 500


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=501", "limit"),
        ("limit=abc", "limit"),
        ("limit=1.5", "limit"),
        ("offset=-1", "offset"),
        ("offset=x", "offset"),
    ],
)
async def test_list_rejects_out_of_range_paging(any_client: Client, query: str, param: str) -> None:
    _, headers = await new_user(any_client)
    project = await new_project(any_client, headers)
    for path in (
        "/api/projects",
        f"/api/projects/{project['id']}/members",
        f"/api/projects/{project['id']}/api-keys",
        f"/api/projects/{project['id']}/runtime-tokens",
    ):
        error = assert_error(await any_client.get(f"{path}?{query}", headers=headers), 400)
        assert error["param"] == param, (path, error)
        assert error["type"] == "invalid_request_error"


async def test_members_list_paginates(client: Client) -> None:
    _, owner, owner_id = await user_with_id(client, "owner")
    project = await new_project(client, owner)
    emails = []
    for i in range(3):
        email, _ = await new_user(client, f"m{i}")
        emails.append(email)
        added = await client.post(
            f"/api/projects/{project['id']}/members", json={"email": email}, headers=owner
        )
        assert added.status_code == 201, added.text
    url = f"/api/projects/{project['id']}/members"
    full = (await client.get(url, headers=owner)).json()
    assert full["total"] == 4
    assert [m["email"] for m in full["items"][1:]] == emails  # oldest first, owner first
    assert full["items"][0]["userId"] == str(owner_id)
    assert all(set(m) == MEMBER_FIELDS for m in full["items"])
    page = (await client.get(f"{url}?limit=2&offset=1", headers=owner)).json()
    assert page["total"] == 4
    assert page["limit"] == 2
    assert page["offset"] == 1
    assert [m["email"] for m in page["items"]] == emails[:2]


# ---------------------------------------------------------------------- members


async def test_member_lifecycle_and_read_only_role(client: Client) -> None:
    _, owner = await new_user(client, "owner")
    member_email, member = await new_user(client, "member")
    project = await new_project(client, owner)
    pid = project["id"]
    key = await create_api_key(client, pid, owner)
    token = await create_runtime_token(client, pid, owner)

    # Not a member yet: the project does not exist for them.
    assert_error(await client.get(f"/api/projects/{pid}", headers=member), 404, "project_not_found")

    added = await client.post(
        f"/api/projects/{pid}/members",
        json={"email": f"  {member_email.upper()} "},
        headers=owner,
    )
    assert added.status_code == 201, added.text
    body = added.json()
    assert set(body) == MEMBER_FIELDS
    assert body["email"] == member_email
    assert body["role"] == "member"
    assert ISO_UTC.match(body["addedAt"])
    member_id = body["userId"]

    # Members read.
    got = await client.get(f"/api/projects/{pid}", headers=member)
    assert got.status_code == 200
    assert got.json()["role"] == "member"
    listed = (await client.get("/api/projects", headers=member)).json()
    assert listed["total"] == 1
    assert listed["items"][0]["role"] == "member"
    for path in ("members", "api-keys", "runtime-tokens"):
        response = await client.get(f"/api/projects/{pid}/{path}", headers=member)
        assert response.status_code == 200, (path, response.text)
    keys_text = (await client.get(f"/api/projects/{pid}/api-keys", headers=member)).text
    assert key["key"] not in keys_text

    # ...and nothing else.
    _, other = await new_user(client, "third")
    other_email = (await client.get("/api/auth/me", headers=other)).json()["email"]
    forbidden = [
        client.patch(f"/api/projects/{pid}", json={"name": "x"}, headers=member),
        client.delete(f"/api/projects/{pid}", headers=member),
        client.post(f"/api/projects/{pid}/members", json={"email": other_email}, headers=member),
        client.delete(f"/api/projects/{pid}/members/{project['ownerId']}", headers=member),
        client.post(f"/api/projects/{pid}/api-keys", json={}, headers=member),
        client.delete(f"/api/projects/{pid}/api-keys/{key['id']}", headers=member),
        client.post(f"/api/projects/{pid}/runtime-tokens", json={}, headers=member),
        client.delete(f"/api/projects/{pid}/runtime-tokens/{token['id']}", headers=member),
    ]
    for request in forbidden:
        error = assert_error(await request, 403, "insufficient_role")
        assert error["type"] == "permission_error"
    # Nothing changed.
    assert (await client.get(f"/api/projects/{pid}", headers=owner)).json()["name"] == "Acme"
    assert (await client.get(f"/api/projects/{pid}", headers=bearer(key["key"]))).status_code == 200

    # A member may leave on their own.
    left = await client.delete(f"/api/projects/{pid}/members/{member_id}", headers=member)
    assert left.status_code == 204, left.text
    assert_error(await client.get(f"/api/projects/{pid}", headers=member), 404, "project_not_found")
    assert (await client.get("/api/projects", headers=member)).json()["total"] == 0
    members = (await client.get(f"/api/projects/{pid}/members", headers=owner)).json()
    assert [m["role"] for m in members["items"]] == ["owner"]


async def test_owner_removes_a_member(any_client: Client) -> None:
    _, owner = await new_user(any_client, "owner")
    email, member, member_id = await user_with_id(any_client, "member")
    project = await new_project(any_client, owner)
    pid = project["id"]
    await any_client.post(f"/api/projects/{pid}/members", json={"email": email}, headers=owner)
    assert (await any_client.get(f"/api/projects/{pid}", headers=member)).status_code == 200

    removed = await any_client.delete(f"/api/projects/{pid}/members/{member_id}", headers=owner)
    assert removed.status_code == 204, removed.text
    assert_error(await any_client.get(f"/api/projects/{pid}", headers=member), 404)
    again = await any_client.delete(f"/api/projects/{pid}/members/{member_id}", headers=owner)
    assert_error(again, 404, "member_not_found")
    stranger = await any_client.delete(f"/api/projects/{pid}/members/{MISSING}", headers=owner)
    assert_error(stranger, 404, "member_not_found")


async def test_a_member_added_as_owner_manages_the_project(client: Client) -> None:
    _, owner, owner_id = await user_with_id(client, "owner")
    co_email, co_owner, co_id = await user_with_id(client, "co-owner")
    third_email, third = await new_user(client, "third")
    project = await new_project(client, owner)
    pid = project["id"]

    added = await client.post(
        f"/api/projects/{pid}/members", json={"email": co_email, "role": "owner"}, headers=owner
    )
    assert added.status_code == 201, added.text
    assert added.json()["role"] == "owner"
    got = (await client.get(f"/api/projects/{pid}", headers=co_owner)).json()
    assert got["role"] == "owner"
    assert got["ownerId"] == str(owner_id)  # the creator stays the project's owner

    # A co-owner manages settings, members and credentials ...
    renamed = await client.patch(f"/api/projects/{pid}", json={"name": "Shared"}, headers=co_owner)
    assert renamed.status_code == 200, renamed.text
    invited = await client.post(
        f"/api/projects/{pid}/members", json={"email": third_email}, headers=co_owner
    )
    assert invited.status_code == 201, invited.text
    assert (await client.get(f"/api/projects/{pid}", headers=third)).json()["role"] == "member"
    key = await create_api_key(client, pid, co_owner)
    assert (await client.get(f"/api/projects/{pid}", headers=bearer(key["key"]))).status_code == 200
    # ... but cannot remove the creator; the creator can remove the co-owner.
    refused = await client.delete(f"/api/projects/{pid}/members/{owner_id}", headers=co_owner)
    assert_error(refused, 409, "owner_not_removable")
    removed = await client.delete(f"/api/projects/{pid}/members/{co_id}", headers=owner)
    assert removed.status_code == 204, removed.text
    assert_error(
        await client.get(f"/api/projects/{pid}", headers=co_owner), 404, "project_not_found"
    )


async def test_the_owner_cannot_be_removed(any_client: Client) -> None:
    _, owner, owner_id = await user_with_id(any_client, "owner")
    project = await new_project(any_client, owner)
    response = await any_client.delete(
        f"/api/projects/{project['id']}/members/{owner_id}", headers=owner
    )
    assert_error(response, 409, "owner_not_removable")
    assert (
        await any_client.get(f"/api/projects/{project['id']}", headers=owner)
    ).status_code == 200


async def test_add_member_errors(any_client: Client) -> None:
    _, owner = await new_user(any_client, "owner")
    email, _ = await new_user(any_client, "member")
    project = await new_project(any_client, owner)
    url = f"/api/projects/{project['id']}/members"

    unknown = await any_client.post(url, json={"email": unique_email("ghost")}, headers=owner)
    error = assert_error(unknown, 404, "user_not_found")
    assert error["param"] == "email"

    assert (await any_client.post(url, json={"email": email}, headers=owner)).status_code == 201
    duplicate = await any_client.post(url, json={"email": email}, headers=owner)
    assert_error(duplicate, 409, "already_member")

    cases: list[tuple[dict[str, Any], str]] = [
        ({"email": email, "role": "admin"}, "role"),
        ({"email": email, "role": "api_key"}, "role"),
        ({"email": 42}, "email"),
        ({}, "email"),
        ({"email": email, "extra": 1}, "extra"),
    ]
    for body, param in cases:
        error = assert_error(await any_client.post(url, json=body, headers=owner), 400)
        assert error["param"] == param, (body, error)
    bad_address = await any_client.post(url, json={"email": "not-an-address"}, headers=owner)
    assert_error(bad_address, 400, "invalid_email")


async def test_a_disabled_user_cannot_be_added(client: Client) -> None:
    _, owner = await new_user(client, "owner")
    email, _, user_id = await user_with_id(client, "disabled")
    await set_user_flags(settings_of(client), user_id, disabled=True)
    project = await new_project(client, owner)
    response = await client.post(
        f"/api/projects/{project['id']}/members", json={"email": email}, headers=owner
    )
    assert_error(response, 404, "user_not_found")


async def test_a_disabled_users_access_token_is_refused(client: Client) -> None:
    _, headers, user_id = await user_with_id(client)
    project = await new_project(client, headers)
    await set_user_flags(settings_of(client), user_id, disabled=True)
    for response in (
        await client.get(f"/api/projects/{project['id']}", headers=headers),
        await client.get("/api/projects", headers=headers),
        await client.get(f"/api/projects/{project['id']}/api-keys", headers=headers),
        await client.post(f"/api/projects/{project['id']}/api-keys", json={}, headers=headers),
    ):
        assert_error(response, 401, "account_disabled")


# ---------------------------------------------------------------------- delete


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_delete_project_takes_its_credentials_with_it(
    backend: str, make_app: AppFactory, pg_settings: Any, sqlite_settings: Any
) -> None:
    settings = pg_settings if backend == "postgres" else sqlite_settings
    async with AsyncTestClient(app=make_app(settings)) as client:
        _, owner = await new_user(client, "owner")
        email, member = await new_user(client, "member")
        project = await new_project(client, owner)
        pid = project["id"]
        await client.post(f"/api/projects/{pid}/members", json={"email": email}, headers=owner)
        key = (await create_api_key(client, pid, owner))["key"]
        token = (await create_runtime_token(client, pid, owner))["token"]
        assert (await client.get("/api/runtime/me", headers=bearer(token))).status_code == 200

        deleted = await client.delete(f"/api/projects/{pid}", headers=owner)
        assert deleted.status_code == 204, deleted.text

        for headers in (owner, member):
            assert_error(await client.get(f"/api/projects/{pid}", headers=headers), 404)
            assert (await client.get("/api/projects", headers=headers)).json()["total"] == 0
        assert_error(await client.get("/api/projects", headers=bearer(key)), 401, "invalid_api_key")
        assert_error(
            await client.get("/api/runtime/me", headers=bearer(token)), 401, "token_revoked"
        )
        again = await client.delete(f"/api/projects/{pid}", headers=owner)
        assert_error(again, 404, "project_not_found")

    # After a restart (the key index is reloaded from the database) the deleted
    # project's key is still refused: its rows went with the project. So is its
    # runtime token, whose revocation mark (in memory on the embedded default) is
    # rebuilt from token_revocation: the token's own row went with the project too.
    async with AsyncTestClient(app=make_app(settings)) as client:
        assert_error(await client.get("/api/projects", headers=bearer(key)), 401, "invalid_api_key")
        assert_error(
            await client.get("/api/runtime/me", headers=bearer(token)), 401, "token_revoked"
        )


async def test_delete_needs_management_rights(client: Client) -> None:
    _, owner = await new_user(client, "owner")
    project = await new_project(client, owner)
    key = (await create_api_key(client, project["id"], owner))["key"]
    error = assert_error(
        await client.delete(f"/api/projects/{project['id']}", headers=bearer(key)), 403
    )
    assert error["code"] == "insufficient_role"
    assert (await client.get(f"/api/projects/{project['id']}", headers=owner)).status_code == 200


# ------------------------------------------------------------------- isolation


def every_route(pid: str, key_id: str, token_id: str, user_id: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", f"/api/projects/{pid}", None),
        ("PATCH", f"/api/projects/{pid}", {"name": "taken over"}),
        ("DELETE", f"/api/projects/{pid}", None),
        ("GET", f"/api/projects/{pid}/members", None),
        ("POST", f"/api/projects/{pid}/members", {"email": unique_email()}),
        ("DELETE", f"/api/projects/{pid}/members/{user_id}", None),
        ("GET", f"/api/projects/{pid}/api-keys", None),
        ("POST", f"/api/projects/{pid}/api-keys", {"name": "x"}),
        ("DELETE", f"/api/projects/{pid}/api-keys/{key_id}", None),
        ("GET", f"/api/projects/{pid}/runtime-tokens", None),
        ("POST", f"/api/projects/{pid}/runtime-tokens", {"name": "x"}),
        ("DELETE", f"/api/projects/{pid}/runtime-tokens/{token_id}", None),
    ]


async def call(client: Client, method: str, url: str, body: Any, headers: dict[str, str]) -> Any:
    if body is None:
        return await client.request(method, url, headers=headers)
    return await client.request(method, url, json=body, headers=headers)


async def test_another_tenants_project_is_a_404_on_every_route(any_client: Client) -> None:
    client = any_client
    _, alice, alice_id = await user_with_id(client, "alice")
    _, bob = await new_user(client, "bob")
    project = await new_project(client, alice)
    pid = project["id"]
    key = await create_api_key(client, pid, alice)
    token = await create_runtime_token(client, pid, alice)
    bob_project = await new_project(client, bob)
    bob_key = (await create_api_key(client, bob_project["id"], bob))["key"]

    for intruder in (bob, bearer(bob_key)):
        for method, url, body in every_route(pid, key["id"], token["id"], str(alice_id)):
            error = assert_error(await call(client, method, url, body, intruder), 404)
            assert error["code"] == "project_not_found", (method, url, error)
            # Exactly what a project that does not exist answers: nothing leaks.
            missing_url = url.replace(pid, MISSING)
            missing = assert_error(await call(client, method, missing_url, body, intruder), 404)
            assert missing == error, (method, url)

    # Alice's project and credentials are untouched.
    fetched = await client.get(f"/api/projects/{pid}", headers=alice)
    assert fetched.status_code == 200
    assert fetched.json()["name"] == project["name"]
    assert (await client.get(f"/api/projects/{pid}", headers=bearer(key["key"]))).status_code == 200
    me = await client.get("/api/runtime/me", headers=bearer(token["token"]))
    assert me.status_code == 200
    members = (await client.get(f"/api/projects/{pid}/members", headers=alice)).json()
    assert members["total"] == 1
    keys = (await client.get(f"/api/projects/{pid}/api-keys", headers=alice)).json()
    assert keys["total"] == 1
    assert keys["items"][0]["revokedAt"] is None
    tokens = (await client.get(f"/api/projects/{pid}/runtime-tokens", headers=alice)).json()
    assert tokens["total"] == 1
    assert tokens["items"][0]["revokedAt"] is None
    # Bob's list does not show it either.
    bob_list = (await client.get("/api/projects", headers=bob)).json()
    assert [p["id"] for p in bob_list["items"]] == [bob_project["id"]]
    key_list = (await client.get("/api/projects", headers=bearer(bob_key))).json()
    assert [p["id"] for p in key_list["items"]] == [bob_project["id"]]


async def test_another_projects_objects_under_your_own_project_are_404(any_client: Client) -> None:
    client = any_client
    _, alice, alice_id = await user_with_id(client, "alice")
    _, bob = await new_user(client, "bob")
    alice_project = await new_project(client, alice)
    bob_project = await new_project(client, bob)
    alice_key = await create_api_key(client, alice_project["id"], alice)
    alice_token = await create_runtime_token(client, alice_project["id"], alice)
    bob_key = (await create_api_key(client, bob_project["id"], bob))["key"]
    bpid = bob_project["id"]

    for headers in (bob, bearer(bob_key)):
        response = await client.delete(
            f"/api/projects/{bpid}/api-keys/{alice_key['id']}", headers=headers
        )
        assert_error(response, 404, "api_key_not_found")
        response = await client.delete(
            f"/api/projects/{bpid}/runtime-tokens/{alice_token['id']}", headers=headers
        )
        assert_error(response, 404, "runtime_token_not_found")
    response = await client.delete(f"/api/projects/{bpid}/members/{alice_id}", headers=bob)
    assert_error(response, 404, "member_not_found")

    # Alice's objects survived and still work.
    apid = alice_project["id"]
    via_key = await client.get(f"/api/projects/{apid}", headers=bearer(alice_key["key"]))
    assert via_key.status_code == 200
    me = await client.get("/api/runtime/me", headers=bearer(alice_token["token"]))
    assert me.status_code == 200
    assert (await client.get(f"/api/projects/{apid}", headers=alice)).status_code == 200
    # Bob's own lists do not show Alice's objects.
    keys = (await client.get(f"/api/projects/{bpid}/api-keys", headers=bob)).json()
    assert alice_key["id"] not in {k["id"] for k in keys["items"]}
    tokens = (await client.get(f"/api/projects/{bpid}/runtime-tokens", headers=bob)).json()
    assert tokens["total"] == 0


async def test_a_malformed_project_id_is_a_404_in_the_error_shape(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    assert_error(await any_client.get("/api/projects/not-a-uuid", headers=headers), 404)


# ------------------------------------------------------------- who may call


async def test_the_projects_api_needs_credentials(any_client: Client) -> None:
    _, headers = await new_user(any_client)
    project = await new_project(any_client, headers)
    for method, url, body in every_route(project["id"], MISSING, MISSING, MISSING):
        assert_error(await call(any_client, method, url, body, {}), 401, "missing_credentials")
    assert_error(await any_client.get("/api/projects"), 401, "missing_credentials")
    bad_scheme = await any_client.get("/api/projects", headers={"Authorization": "Basic abc"})
    assert_error(bad_scheme, 401, "invalid_authorization")
    garbage = await any_client.get("/api/projects", headers=bearer("garbage"))
    assert_error(garbage, 401, "invalid_token")


async def test_runtime_tokens_are_refused_on_every_projects_route(any_client: Client) -> None:
    _, headers, user_id = await user_with_id(any_client)
    project = await new_project(any_client, headers)
    key = await create_api_key(any_client, project["id"], headers)
    token = await create_runtime_token(any_client, project["id"], headers)
    runtime = bearer(token["token"])
    routes = [
        ("GET", "/api/projects", None),
        ("POST", "/api/projects", {"name": "from a runtime"}),
        *every_route(project["id"], key["id"], token["id"], str(user_id)),
    ]
    for method, url, body in routes:
        error = assert_error(await call(any_client, method, url, body, runtime), 403)
        assert error["code"] == "runtime_token_not_allowed", (method, url, error)
    # Nothing happened on the way.
    fetched = await any_client.get(f"/api/projects/{project['id']}", headers=headers)
    assert fetched.status_code == 200
    assert fetched.json()["name"] == project["name"]
    assert (await any_client.get("/api/projects", headers=headers)).json()["total"] == 1
    assert (await any_client.get("/api/runtime/me", headers=runtime)).status_code == 200


async def test_api_keys_manage_credentials_only(any_client: Client) -> None:
    client = any_client
    _, owner, owner_id = await user_with_id(client, "owner")
    member_email, _ = await new_user(client, "member")
    project = await new_project(client, owner)
    pid = project["id"]
    automation = bearer((await create_api_key(client, pid, owner))["key"])

    got = await client.get(f"/api/projects/{pid}", headers=automation)
    assert got.status_code == 200
    assert got.json()["role"] == "api_key"
    listed = (await client.get("/api/projects", headers=automation)).json()
    assert listed["total"] == 1
    assert listed["items"][0]["role"] == "api_key"
    assert (await client.get(f"/api/projects/{pid}/members", headers=automation)).status_code == 200

    # Credentials: yes.
    made = await create_api_key(client, pid, automation, name="made by a key")
    assert (
        await client.get(f"/api/projects/{pid}", headers=bearer(made["key"]))
    ).status_code == 200
    token = await create_runtime_token(client, pid, automation)
    revoked = await client.delete(f"/api/projects/{pid}/api-keys/{made['id']}", headers=automation)
    assert revoked.status_code == 204
    revoked = await client.delete(
        f"/api/projects/{pid}/runtime-tokens/{token['id']}", headers=automation
    )
    assert revoked.status_code == 204

    # Project settings and members: no.
    for method, url, body in [
        ("PATCH", f"/api/projects/{pid}", {"name": "x"}),
        ("DELETE", f"/api/projects/{pid}", None),
        ("POST", f"/api/projects/{pid}/members", {"email": member_email}),
        ("DELETE", f"/api/projects/{pid}/members/{owner_id}", None),
    ]:
        assert_error(await call(client, method, url, body, automation), 403, "insufficient_role")
    # Creating a project needs a user behind the request (someone must own it).
    assert_error(await create(client, automation, name="by a key"), 403, "user_token_required")
    assert (await client.get("/api/projects", headers=owner)).json()["total"] == 1


# ------------------------------------------------------------- platform admins


async def test_the_admin_token_sees_and_manages_every_project(
    pg_settings: Any, make_app: AppFactory
) -> None:
    admin_token = "admin-" + uuid.uuid4().hex + uuid.uuid4().hex
    settings = with_settings(pg_settings, admin_token=admin_token)
    async with AsyncTestClient(app=make_app(settings)) as client:
        admin = bearer(admin_token)
        owners = [await new_user(client, f"owner{i}") for i in range(2)]
        projects = [await new_project(client, headers) for _, headers in owners]
        member_email, member = await new_user(client, "member")

        listed = await client.get("/api/projects?limit=500", headers=admin)
        assert listed.status_code == 200, listed.text
        body = listed.json()
        ids = {p["id"] for p in body["items"]}
        assert {p["id"] for p in projects} <= ids
        assert body["total"] >= len(projects)
        assert all(p["role"] == "admin" for p in body["items"])

        page = (await client.get("/api/projects?limit=1&offset=1", headers=admin)).json()
        assert page["total"] == body["total"]
        assert len(page["items"]) == 1
        assert page["items"][0]["id"] == body["items"][1]["id"]

        pid = projects[0]["id"]
        got = await client.get(f"/api/projects/{pid}", headers=admin)
        assert got.status_code == 200
        assert got.json()["role"] == "admin"
        patched = await client.patch(f"/api/projects/{pid}", json={"name": "Ops"}, headers=admin)
        assert patched.status_code == 200
        assert patched.json()["name"] == "Ops"
        added = await client.post(
            f"/api/projects/{pid}/members", json={"email": member_email}, headers=admin
        )
        assert added.status_code == 201, added.text
        assert (await client.get(f"/api/projects/{pid}", headers=member)).status_code == 200
        key = await create_api_key(client, pid, admin)
        assert (
            await client.get(f"/api/projects/{pid}", headers=bearer(key["key"]))
        ).status_code == 200
        owner_removal = await client.delete(
            f"/api/projects/{pid}/members/{projects[0]['ownerId']}", headers=admin
        )
        assert_error(owner_removal, 409, "owner_not_removable")
        assert_error(await client.get(f"/api/projects/{MISSING}", headers=admin), 404)

        deleted = await client.delete(f"/api/projects/{projects[1]['id']}", headers=admin)
        assert deleted.status_code == 204
        assert_error(
            await client.get(f"/api/projects/{projects[1]['id']}", headers=owners[1][1]), 404
        )

    # Without ARONA_ADMIN_TOKEN configured the same string is just an invalid token.
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        assert_error(await client.get("/api/projects", headers=bearer(admin_token)), 401)


async def test_an_admin_user_sees_every_project(client: Client) -> None:
    _, admin, admin_id = await user_with_id(client, "admin")
    await set_user_flags(settings_of(client), admin_id, is_admin=True)
    _, other = await new_user(client, "other")
    theirs = await new_project(client, other)
    mine = await new_project(client, admin)

    listed = (await client.get("/api/projects?limit=500", headers=admin)).json()
    roles = {p["id"]: p["role"] for p in listed["items"]}
    assert roles[theirs["id"]] == "admin"
    assert roles[mine["id"]] == "owner"
    assert listed["total"] >= 2

    got = await client.get(f"/api/projects/{theirs['id']}", headers=admin)
    assert got.status_code == 200
    assert got.json()["role"] == "admin"
    assert (await client.get(f"/api/projects/{mine['id']}", headers=admin)).json()[
        "role"
    ] == "owner"
    patched = await client.patch(
        f"/api/projects/{theirs['id']}", json={"name": "Renamed by admin"}, headers=admin
    )
    assert patched.status_code == 200, patched.text
    # The other user still sees only their own.
    assert (await client.get("/api/projects", headers=other)).json()["total"] == 1

    # Losing the flag takes the access away at once.
    await set_user_flags(settings_of(client), admin_id, is_admin=False)
    assert_error(await client.get(f"/api/projects/{theirs['id']}", headers=admin), 404)
    assert (await client.get("/api/projects", headers=admin)).json()["total"] == 1


async def test_the_first_user_is_a_platform_admin(tmp_path: Any, make_app: AppFactory) -> None:
    settings = base_settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
    await asyncio.to_thread(upgrade, settings)
    async with AsyncTestClient(app=make_app(settings)) as client:
        _, first = await new_user(client, "first")
        _, second = await new_user(client, "second")
        assert (await client.get("/api/auth/me", headers=first)).json()["isAdmin"] is True
        assert (await client.get("/api/auth/me", headers=second)).json()["isAdmin"] is False
        theirs = await new_project(client, second)
        listed = (await client.get("/api/projects", headers=first)).json()
        assert listed["total"] == 1
        assert listed["items"][0]["id"] == theirs["id"]
        assert listed["items"][0]["role"] == "admin"
        assert (await client.get("/api/projects", headers=second)).json()["total"] == 1
        _, third = await new_user(client, "third")
        assert (await client.get("/api/projects", headers=third)).json()["total"] == 0
        assert_error(await client.get(f"/api/projects/{theirs['id']}", headers=third), 404)
