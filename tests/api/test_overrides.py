"""``/api/projects/{projectId}/overrides``: BYO override keys over HTTP.

CRUD on PostgreSQL + Redis and on SQLite; the key is stored sealed (associated data
``("override_key", project_id, row_id)``) and never leaves the API (every response
body is searched for it); another tenant gets a 404 on every route; every write
refuses bad input with a 400 naming the field; members read, owners, platform admins
and the project's API keys write. The index behind the gateway is tested in
``tests/domain/test_override_index.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from app.db.models import OverrideKey
from app.lib.settings import Settings
from app.lib.vault import MASK, VaultDecryptError, aad
from tests.support.api import (
    Client,
    create_api_key,
    create_runtime_token,
    db_session,
    resources_of,
    settings_of,
)
from tests.support.helpers import assert_error, bearer, new_project, new_user
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "admin-" + "o" * 40
ADMIN = bearer(ADMIN_TOKEN)
OVERRIDE_FIELDS = {"id", "conversationId", "modelId", "keyHint", "createdAt"}
MISSING = "00000000-0000-4000-8000-000000000000"


def provider_key() -> str:
    """A distinctive fake provider key: easy to search for in response bodies."""
    return f"sk-byo-{uuid.uuid4().hex}"


@dataclass
class Tenant:
    project_id: str
    owner: dict[str, str]
    key: dict[str, str]
    """The project's API key (automation)."""

    @property
    def base(self) -> str:
        return f"/api/projects/{self.project_id}/overrides"


async def new_tenant(client: Client) -> Tenant:
    _, owner = await new_user(client, "owner")
    project = await new_project(client, owner)
    key = await create_api_key(client, project["id"], owner)
    return Tenant(project_id=project["id"], owner=owner, key=bearer(key["key"]))


async def create_override(
    client: Client, tenant: Tenant, headers: dict[str, str] | None = None, **body: Any
) -> dict[str, Any]:
    fields = {"conversationId": "conv-1", "modelId": "qwen-qwq-32b", "apiKey": provider_key()}
    fields.update(body)
    response = await client.post(tenant.base, json=fields, headers=headers or tenant.owner)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@pytest.fixture
async def admin_client(pg_settings: Settings, make_app: AppFactory) -> AsyncIterator[Client]:
    """PostgreSQL + Redis with an operator admin token."""
    app = make_app(with_settings(pg_settings, admin_token=ADMIN_TOKEN))
    async with AsyncTestClient(app=app) as client:
        yield client


# ------------------------------------------------------------------- CRUD


async def test_create_list_get_and_delete(any_client: Client) -> None:
    tenant = await new_tenant(any_client)
    key = provider_key()
    response = await any_client.post(
        tenant.base,
        json={"conversationId": "conv-42", "modelId": "qwen-qwq-32b", "apiKey": key},
        headers=tenant.owner,
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created) == OVERRIDE_FIELDS
    assert created["conversationId"] == "conv-42"
    assert created["modelId"] == "qwen-qwq-32b"
    assert created["keyHint"] == MASK + key[-4:] == "••••" + key[-4:]
    UUID(created["id"])

    listed = await any_client.get(tenant.base, headers=tenant.owner)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"items": [created], "total": 1, "limit": 50, "offset": 0}
    one = await any_client.get(f"{tenant.base}/{created['id']}", headers=tenant.owner)
    assert one.status_code == 200, one.text
    assert one.json() == created

    deleted = await any_client.delete(f"{tenant.base}/{created['id']}", headers=tenant.owner)
    assert deleted.status_code == 204, deleted.text
    assert deleted.content == b""
    assert (await any_client.get(tenant.base, headers=tenant.owner)).json()["total"] == 0
    assert_error(
        await any_client.get(f"{tenant.base}/{created['id']}", headers=tenant.owner),
        404,
        "override_not_found",
    )
    assert_error(
        await any_client.delete(f"{tenant.base}/{created['id']}", headers=tenant.owner),
        404,
        "override_not_found",
    )
    assert_error(
        await any_client.delete(f"{tenant.base}/{MISSING}", headers=tenant.owner),
        404,
        "override_not_found",
    )


async def test_the_key_is_stored_sealed_to_its_row(any_client: Client) -> None:
    tenant, other = await new_tenant(any_client), await new_tenant(any_client)
    key = provider_key()
    created = await create_override(any_client, tenant, apiKey=key)
    async with db_session(settings_of(any_client)) as session:
        row = await session.scalar(select(OverrideKey).where(OverrideKey.id == UUID(created["id"])))
    assert row is not None
    assert str(row.project_id) == tenant.project_id
    assert row.conversation_id == "conv-1"
    assert row.model_prefix == "qwen-qwq-32b"
    assert row.key_hint == MASK + key[-4:]
    assert key not in row.key_encrypted
    assert row.key_encrypted.startswith("v1:k1:")
    # Exactly the associated data ``arona vault rotate`` re-encrypts with.
    vault = resources_of(any_client).vault
    assert vault.decrypt(row.key_encrypted, aad("override_key", row.project_id, row.id)) == key
    for wrong in (
        aad("override_key", UUID(other.project_id), row.id),
        aad("override_key", row.project_id, uuid.uuid4()),
        aad("project_secret", row.project_id, row.id),
    ):
        with pytest.raises(VaultDecryptError):
            vault.decrypt(row.key_encrypted, wrong)


async def test_a_short_key_is_fully_masked(client: Client) -> None:
    tenant = await new_tenant(client)
    assert (await create_override(client, tenant, apiKey="abcd"))["keyHint"] == MASK
    assert (await create_override(client, tenant, modelId="m2", apiKey="x"))["keyHint"] == MASK


async def test_boundary_lengths_are_accepted(client: Client) -> None:
    tenant = await new_tenant(client)
    conversation, model, key = "c" * 200, "m" * 200, "k" * 8191 + "Z"
    created = await create_override(
        client, tenant, conversationId=conversation, modelId=model, apiKey=key
    )
    assert created["conversationId"] == conversation
    assert created["modelId"] == model
    assert created["keyHint"] == MASK + "kkkZ"
    # Identifiers are taken as they are: any visible characters, inner spaces included.
    odd = await create_override(
        client, tenant, conversationId="chat 7/ü:ß", modelId="org/Model:Tag"
    )
    assert (odd["conversationId"], odd["modelId"]) == ("chat 7/ü:ß", "org/Model:Tag")


async def test_a_target_holds_one_key(any_client: Client) -> None:
    tenant, other = await new_tenant(any_client), await new_tenant(any_client)
    first = await create_override(any_client, tenant, conversationId="c", modelId="gpt-4o")
    again = await any_client.post(
        tenant.base,
        json={"conversationId": "c", "modelId": "gpt-4o", "apiKey": provider_key()},
        headers=tenant.owner,
    )
    error = assert_error(again, 409, "override_exists")
    assert error["param"] == "modelId"
    # Another model prefix (even a longer one), another conversation, another project.
    await create_override(any_client, tenant, conversationId="c", modelId="gpt-4o-mini")
    await create_override(any_client, tenant, conversationId="c2", modelId="gpt-4o")
    await create_override(any_client, other, conversationId="c", modelId="gpt-4o")
    # Case matters: ids are compared exactly.
    await create_override(any_client, tenant, conversationId="C", modelId="gpt-4o")
    await create_override(any_client, tenant, conversationId="c", modelId="GPT-4o")
    listed = (await any_client.get(tenant.base, headers=tenant.owner)).json()
    assert listed["total"] == 5
    # Replacing: delete, then create.
    deleted = await any_client.delete(f"{tenant.base}/{first['id']}", headers=tenant.owner)
    assert deleted.status_code == 204
    await create_override(any_client, tenant, conversationId="c", modelId="gpt-4o")


async def test_list_filters_by_conversation_and_paginates(client: Client) -> None:
    tenant = await new_tenant(client)
    made = []
    for conversation, model in (("a", "m1"), ("b", "m1"), ("a", "m2"), ("a", "m3"), ("b", "m2")):
        made.append(
            await create_override(client, tenant, conversationId=conversation, modelId=model)
        )
    newest_first = list(reversed(made))

    full = (await client.get(tenant.base, headers=tenant.owner)).json()
    assert full["total"] == 5
    assert [o["id"] for o in full["items"]] == [o["id"] for o in newest_first]

    page = (await client.get(f"{tenant.base}?limit=2&offset=1", headers=tenant.owner)).json()
    assert (page["total"], page["limit"], page["offset"]) == (5, 2, 1)
    assert [o["id"] for o in page["items"]] == [o["id"] for o in newest_first[1:3]]
    tail = (await client.get(f"{tenant.base}?offset=4", headers=tenant.owner)).json()
    assert [o["id"] for o in tail["items"]] == [newest_first[4]["id"]]
    beyond = (await client.get(f"{tenant.base}?offset=10", headers=tenant.owner)).json()
    assert (beyond["items"], beyond["total"]) == ([], 5)

    only_a = await client.get(tenant.base, params={"conversationId": "a"}, headers=tenant.owner)
    assert only_a.status_code == 200, only_a.text
    body = only_a.json()
    assert body["total"] == 3
    assert [o["modelId"] for o in body["items"]] == ["m3", "m2", "m1"]
    assert {o["conversationId"] for o in body["items"]} == {"a"}
    a_page = await client.get(
        tenant.base, params={"conversationId": "a", "limit": 1, "offset": 1}, headers=tenant.owner
    )
    assert a_page.json()["total"] == 3
    assert [o["modelId"] for o in a_page.json()["items"]] == ["m2"]
    none = await client.get(tenant.base, params={"conversationId": "zzz"}, headers=tenant.owner)
    assert none.json() == {"items": [], "total": 0, "limit": 50, "offset": 0}


# ------------------------------------------------------------ secrecy


async def test_the_key_never_appears_in_a_response(admin_client: Client) -> None:
    client = admin_client
    tenant = await new_tenant(client)
    key = provider_key()
    bodies: list[str] = []

    async def record(response: httpx.Response) -> httpx.Response:
        bodies.append(response.text)
        return response

    created = (
        await record(
            await client.post(
                tenant.base,
                json={"conversationId": "c", "modelId": "gpt-4o", "apiKey": key},
                headers=tenant.owner,
            )
        )
    ).json()
    # The same key again: a 409, then under another target, then refused forms of it.
    await record(
        await client.post(
            tenant.base,
            json={"conversationId": "c", "modelId": "gpt-4o", "apiKey": key},
            headers=tenant.owner,
        )
    )
    await record(
        await client.post(
            tenant.base,
            json={"conversationId": "c", "modelId": "gpt-4", "apiKey": key},
            headers=tenant.key,
        )
    )
    for refused in (f"{key} ", f"{key}\n", f"{key}\u00e9", key * 300):
        response = await record(
            await client.post(
                tenant.base,
                json={"conversationId": "c", "modelId": "x", "apiKey": refused},
                headers=tenant.owner,
            )
        )
        assert response.status_code == 400, response.text
    await record(
        await client.post(
            tenant.base,
            json={"conversationId": "c", "modelId": "x", "apiKey": key, "extra": 1},
            headers=tenant.owner,
        )
    )
    for headers in (tenant.owner, tenant.key, ADMIN):
        await record(await client.get(tenant.base, headers=headers))
        await record(await client.get(tenant.base, params={"conversationId": "c"}, headers=headers))
        await record(await client.get(f"{tenant.base}/{created['id']}", headers=headers))
    await record(await client.get("/schema/openapi.json"))
    await record(await client.delete(f"{tenant.base}/{created['id']}", headers=tenant.owner))

    assert len(bodies) > 10
    for text in bodies:
        assert key not in text
        assert key[:-4] not in text
    assert created["keyHint"] == MASK + key[-4:]


# ---------------------------------------------------------- bad input

VALID = {"conversationId": "conv", "modelId": "gpt-4o", "apiKey": "sk-valid-key"}


def _without(field: str) -> dict[str, Any]:
    return {k: v for k, v in VALID.items() if k != field}


INVALID, VALUE = "invalid_request", "invalid_value"
BAD_BODIES: list[tuple[str, Any, str | None, str]] = [
    ("missing conversationId", _without("conversationId"), "conversationId", "invalid_request"),
    ("missing modelId", _without("modelId"), "modelId", "invalid_request"),
    ("missing apiKey", _without("apiKey"), "apiKey", "invalid_request"),
    ("empty conversationId", {**VALID, "conversationId": ""}, "conversationId", "invalid_request"),
    ("long conversationId", {**VALID, "conversationId": "c" * 201}, "conversationId", INVALID),
    ("empty modelId", {**VALID, "modelId": ""}, "modelId", "invalid_request"),
    ("long modelId", {**VALID, "modelId": "m" * 201}, "modelId", "invalid_request"),
    ("empty apiKey", {**VALID, "apiKey": ""}, "apiKey", "invalid_request"),
    ("long apiKey", {**VALID, "apiKey": "k" * 8193}, "apiKey", "invalid_request"),
    ("null apiKey", {**VALID, "apiKey": None}, "apiKey", "invalid_request"),
    ("number conversationId", {**VALID, "conversationId": 7}, "conversationId", INVALID),
    ("list modelId", {**VALID, "modelId": ["gpt"]}, "modelId", "invalid_request"),
    ("unknown field", {**VALID, "key": "sk"}, "key", "invalid_request"),
    ("snake_case field", {**_without("apiKey"), "api_key": "sk"}, "api_key", "invalid_request"),
    ("padded conversationId", {**VALID, "conversationId": " conv"}, "conversationId", VALUE),
    ("blank conversationId", {**VALID, "conversationId": "   "}, "conversationId", VALUE),
    ("padded modelId", {**VALID, "modelId": "gpt-4o "}, "modelId", "invalid_value"),
    ("NUL in modelId", {**VALID, "modelId": "gpt\x00"}, "modelId", "unsupported_character"),
    ("control in modelId", {**VALID, "modelId": "gpt\x07"}, "modelId", "invalid_value"),
    ("newline in conversationId", {**VALID, "conversationId": "a\nb"}, "conversationId", VALUE),
    ("space in apiKey", {**VALID, "apiKey": "sk key"}, "apiKey", "invalid_api_key"),
    ("newline in apiKey", {**VALID, "apiKey": "sk-key\r\n"}, "apiKey", "invalid_api_key"),
    ("non-ASCII apiKey", {**VALID, "apiKey": "sk-ключ"}, "apiKey", "invalid_api_key"),
    ("body not an object", [VALID], None, "invalid_request"),
]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [pytest.param(b, p, c, id=name) for name, b, p, c in BAD_BODIES],
)
async def test_bad_input_on_create_is_a_400_naming_the_field(
    client: Client, body: Any, param: str | None, code: str
) -> None:
    tenant = await new_tenant(client)
    for headers in (tenant.owner, tenant.key):
        error = assert_error(await client.post(tenant.base, json=body, headers=headers), 400, code)
        assert error["param"] == param, error
    assert (await client.get(tenant.base, headers=tenant.owner)).json()["total"] == 0


async def test_malformed_and_missing_bodies(any_client: Client) -> None:
    tenant = await new_tenant(any_client)
    headers = {**tenant.owner, "Content-Type": "application/json"}
    assert_error(
        await any_client.post(tenant.base, content=b"{not json", headers=headers),
        400,
        "invalid_json",
    )
    assert_error(await any_client.post(tenant.base, headers=tenant.owner), 400, "invalid_json")
    assert (await any_client.get(tenant.base, headers=tenant.owner)).json()["total"] == 0


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"offset": -1}, "offset"),
        ({"conversationId": ""}, "conversationId"),
        ({"conversationId": "c" * 201}, "conversationId"),
    ],
)
async def test_bad_list_queries_are_400s(client: Client, query: dict[str, Any], param: str) -> None:
    tenant = await new_tenant(client)
    error = assert_error(await client.get(tenant.base, params=query, headers=tenant.owner), 400)
    assert error["param"] == param, error


async def test_a_malformed_override_id_matches_no_route(client: Client) -> None:
    tenant = await new_tenant(client)
    assert_error(await client.get(f"{tenant.base}/not-a-uuid", headers=tenant.owner), 404)
    assert_error(await client.delete(f"{tenant.base}/not-a-uuid", headers=tenant.owner), 404)


# ----------------------------------------------------------------- roles


async def test_members_read_and_writers_write(admin_client: Client) -> None:
    client = admin_client
    tenant = await new_tenant(client)
    member_email, member = await new_user(client, "member")
    added = await client.post(
        f"/api/projects/{tenant.project_id}/members",
        json={"email": member_email},
        headers=tenant.owner,
    )
    assert added.status_code == 201, added.text
    existing = await create_override(client, tenant, conversationId="seed")

    # A member reads...
    listed = await client.get(tenant.base, headers=member)
    assert listed.status_code == 200, listed.text
    assert listed.json()["items"] == [existing]
    one = await client.get(f"{tenant.base}/{existing['id']}", headers=member)
    assert one.status_code == 200
    assert one.json() == existing
    # ... but writes nothing.
    assert_error(
        await client.post(
            tenant.base, json={**VALID, "conversationId": "by-member"}, headers=member
        ),
        403,
        "insufficient_role",
    )
    assert_error(
        await client.delete(f"{tenant.base}/{existing['id']}", headers=member),
        403,
        "insufficient_role",
    )

    # The owner, the project's API key and a platform admin write.
    for i, headers in enumerate((tenant.owner, tenant.key, ADMIN)):
        made = await create_override(client, tenant, headers, conversationId=f"w{i}")
        listed = await client.get(tenant.base, headers=headers)
        assert made in listed.json()["items"]
        response = await client.delete(f"{tenant.base}/{made['id']}", headers=headers)
        assert response.status_code == 204, response.text

    # Runtime tokens never reach the Projects API; no credentials is a 401.
    runtime = bearer((await create_runtime_token(client, tenant.project_id, tenant.owner))["token"])
    item = f"{tenant.base}/{existing['id']}"
    for response in (
        await client.get(tenant.base, headers=runtime),
        await client.get(item, headers=runtime),
        await client.post(tenant.base, json=VALID, headers=runtime),
        await client.delete(item, headers=runtime),
    ):
        assert_error(response, 403, "runtime_token_not_allowed")
    for response in (
        await client.get(tenant.base),
        await client.get(item),
        await client.post(tenant.base, json=VALID),
        await client.delete(item),
    ):
        assert_error(response, 401)
    assert (await client.get(tenant.base, headers=tenant.owner)).json()["items"] == [existing]


async def test_another_tenant_gets_a_404_on_every_route(client: Client) -> None:
    a, b = await new_tenant(client), await new_tenant(client)
    _, stranger = await new_user(client, "stranger")
    a_override = await create_override(client, a)
    b_override = await create_override(client, b)
    a_item = f"{a.base}/{a_override['id']}"

    # Another project's owner, another project's API key, a user of no project.
    for headers in (b.owner, b.key, stranger):
        for response in (
            await client.get(a.base, headers=headers),
            await client.get(a.base, params={"conversationId": "conv-1"}, headers=headers),
            await client.get(a_item, headers=headers),
            await client.post(a.base, json=VALID, headers=headers),
            await client.delete(a_item, headers=headers),
            await client.delete(f"{a.base}/{MISSING}", headers=headers),
        ):
            assert_error(response, 404, "project_not_found")
    # Under its own project, another project's override id does not exist.
    for response in (
        await client.get(f"{b.base}/{a_override['id']}", headers=b.owner),
        await client.delete(f"{b.base}/{a_override['id']}", headers=b.owner),
        await client.delete(f"{b.base}/{a_override['id']}", headers=b.key),
    ):
        assert_error(response, 404, "override_not_found")
    # A project that does not exist at all looks the same.
    assert_error(
        await client.get(f"/api/projects/{MISSING}/overrides", headers=a.owner),
        404,
        "project_not_found",
    )

    assert (await client.get(a_item, headers=a.owner)).json() == a_override
    assert (await client.get(a.base, headers=a.owner)).json()["items"] == [a_override]
    assert (await client.get(b.base, headers=b.owner)).json()["items"] == [b_override]
