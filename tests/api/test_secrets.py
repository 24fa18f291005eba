"""Secrets API (``/api/projects/{projectId}/secrets``) and the service API others use.

Values are write-only: no response carries one, and the leak test at the end looks
for every plaintext in every response body and every captured log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from typing import Any
from uuid import UUID

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import update

from app.db.models import ProjectSecret
from app.domain.secrets.aad import secret_aad
from app.domain.secrets.services import (
    CHANNEL,
    ProjectSecretService,
    SecretResolver,
    SecretUnreadableError,
)
from app.lib.errors import ConflictError, NotFoundError
from app.lib.events.redis import RedisEventBus
from app.lib.redis_client import build_redis
from app.lib.settings import Settings
from app.lib.vault import Vault
from tests.support.api import Client, create_runtime_token, resources_of, settings_of
from tests.support.conversations import Tenant, db_config, new_tenant
from tests.support.helpers import assert_error, bearer, new_user
from tests.support.live_server import live_server
from tests.support.secrets import (
    ADMIN,
    ADMIN_TOKEN,
    MISSING,
    SECRET_FIELDS,
    add_custom_llm,
    base,
    client_engine,
    create_secret,
    new_key,
    plaintext,
    remove_custom_llm,
    secrets_client,
    stored_token,
)
from tests.support.settings import AppFactory, with_settings

__all__ = ["secrets_client"]

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")


def _vault(client: Client) -> Vault:
    return resources_of(client).vault


async def _resolver_reveal(client: Client, project_id: Any, secret_id: Any) -> str:
    resources = resources_of(client)
    async with db_config(client) as config:
        return await SecretResolver(config, resources.vault).reveal(
            UUID(str(project_id)), UUID(str(secret_id))
        )


async def _add_member(client: Client, tenant: Tenant) -> dict[str, str]:
    email, headers = await new_user(client, "member")
    response = await client.post(
        f"/api/projects/{tenant.project_id}/members",
        json={"email": email, "role": "member"},
        headers=tenant.owner,
    )
    assert response.status_code == 201, response.text
    return headers


# ----------------------------------------------------------------- the happy path


async def test_secret_lifecycle(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    url = base(tenant.project_id)
    first = plaintext("first")
    response = await client.post(
        url,
        json={"name": "openai.key_1", "value": first, "description": "prod key"},
        headers=tenant.owner,
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created) == SECRET_FIELDS
    assert created["name"] == "openai.key_1"
    assert created["description"] == "prod key"
    assert created["hint"] == "••••" + first[-4:]
    assert created["rotatedAt"] is None
    assert created["usedBy"] == []
    assert ISO_UTC.match(created["createdAt"])
    sid = created["id"]

    async with client_engine(client) as engine:
        token = await stored_token(engine, sid)
    assert token.startswith("v1:k1:")
    assert first not in token
    assert _vault(client).decrypt(token, secret_aad(UUID(tenant.project_id), UUID(sid))) == first

    got = await client.get(f"{url}/{sid}", headers=tenant.owner)
    assert got.status_code == 200, got.text
    assert got.json() == created

    listed = await client.get(url, headers=tenant.owner)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"items": [created], "total": 1, "limit": 50, "offset": 0}

    second = plaintext("second")
    rotated = await client.put(f"{url}/{sid}/value", json={"value": second}, headers=tenant.owner)
    assert rotated.status_code == 200, rotated.text
    body = rotated.json()
    assert set(body) == SECRET_FIELDS
    assert body["hint"] == "••••" + second[-4:]
    assert body["rotatedAt"] is not None
    assert ISO_UTC.match(body["rotatedAt"])
    assert body["createdAt"] == created["createdAt"]
    assert await _resolver_reveal(client, tenant.project_id, sid) == second

    patched = await client.patch(
        f"{url}/{sid}", json={"description": "rotated monthly"}, headers=tenant.owner
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["description"] == "rotated monthly"
    assert patched.json()["hint"] == body["hint"]
    # An empty patch changes nothing; the value is untouched by a description change.
    unchanged = await client.patch(f"{url}/{sid}", json={}, headers=tenant.owner)
    assert unchanged.status_code == 200, unchanged.text
    assert unchanged.json() == patched.json()
    assert await _resolver_reveal(client, tenant.project_id, sid) == second

    deleted = await client.delete(f"{url}/{sid}", headers=tenant.owner)
    assert deleted.status_code == 204, deleted.text
    assert_error(await client.get(f"{url}/{sid}", headers=tenant.owner), 404, "secret_not_found")
    assert_error(await client.delete(f"{url}/{sid}", headers=tenant.owner), 404, "secret_not_found")
    assert (await client.get(url, headers=tenant.owner)).json()["total"] == 0


async def test_short_values_show_no_characters(secrets_client: Client) -> None:
    tenant = await new_tenant(secrets_client)
    created = await create_secret(secrets_client, tenant.project_id, tenant.owner, value="abcd")
    assert created["hint"] == "••••"


async def test_duplicate_name_is_a_conflict(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    await create_secret(client, tenant.project_id, tenant.owner, name="dup")
    error = assert_error(
        await client.post(
            base(tenant.project_id),
            json={"name": "dup", "value": plaintext()},
            headers=tenant.owner,
        ),
        409,
        "secret_exists",
    )
    assert error["param"] == "name"
    assert "dup" in error["message"]
    # Names are unique per project only; case matters.
    other = await new_tenant(client)
    await create_secret(client, other.project_id, other.owner, name="dup")
    await create_secret(client, tenant.project_id, tenant.owner, name="DUP")


@pytest.mark.parametrize("db", ["postgres", "sqlite"])
async def test_concurrent_creates_of_one_name_yield_one_secret(
    db: str, make_app: AppFactory, pg_settings: Settings, sqlite_settings: Settings
) -> None:
    """Truly concurrent requests (a live server: the test client serialises them)."""
    settings = pg_settings if db == "postgres" else sqlite_settings
    async with (
        live_server(make_app(settings)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        tenant = await new_tenant(http)  # type: ignore[arg-type]
        responses = await asyncio.gather(
            *[
                http.post(
                    base(tenant.project_id),
                    json={"name": "race", "value": plaintext()},
                    headers=tenant.owner,
                )
                for _ in range(6)
            ]
        )
        assert [r.status_code for r in responses].count(201) == 1, [r.text for r in responses]
        for r in responses:
            if r.status_code != 201:
                assert_error(r, 409, "secret_exists")
        listed = await http.get(base(tenant.project_id), headers=tenant.owner)
        assert listed.json()["total"] == 1


async def test_delete_racing_a_new_custom_llm_is_refused_by_the_foreign_key(
    secrets_client: Client,
) -> None:
    """A custom LLM created between the in-use check and the delete: the foreign key
    (ON DELETE RESTRICT) refuses and the answer is the same 409."""
    client = secrets_client
    tenant = await new_tenant(client)
    secret = await create_secret(client, tenant.project_id, tenant.owner)
    pid, sid = UUID(tenant.project_id), UUID(secret["id"])

    class LateCheck(ProjectSecretService):
        checks = 0

        async def _refuse_if_used(self, project_id: UUID, secret_id: UUID, name: str) -> None:
            LateCheck.checks += 1
            if LateCheck.checks == 1:
                # The check passes; then the custom LLM appears before the delete.
                async with client_engine(client) as engine:
                    await add_custom_llm(engine, pid, name="late", secret_id=sid)
                return
            await super()._refuse_if_used(project_id, secret_id, name)

    async with db_config(client) as config, LateCheck.new(config=config) as service:
        with pytest.raises(ConflictError) as raised:
            await service.delete_secret(pid, sid)
    assert raised.value.code == "secret_in_use"
    assert "'late'" in raised.value.message
    assert LateCheck.checks == 2
    got = await client.get(f"{base(tenant.project_id)}/{sid}", headers=tenant.owner)
    assert got.status_code == 200, got.text
    assert [user["name"] for user in got.json()["usedBy"]] == ["late"]


# ------------------------------------------------------------------ bad input


BAD_CREATES: list[tuple[Any, str | None, str]] = [
    ({"value": "v"}, "name", "invalid_request"),
    ({"name": "", "value": "v"}, "name", "invalid_request"),
    ({"name": "has space", "value": "v"}, "name", "invalid_request"),
    ({"name": "slash/no", "value": "v"}, "name", "invalid_request"),
    ({"name": "ümlaut", "value": "v"}, "name", "invalid_request"),
    ({"name": "n" * 101, "value": "v"}, "name", "invalid_request"),
    ({"name": 5, "value": "v"}, "name", "invalid_request"),
    ({"name": "ok"}, "value", "invalid_request"),
    ({"name": "ok", "value": ""}, "value", "invalid_request"),
    ({"name": "ok", "value": None}, "value", "invalid_request"),
    ({"name": "ok", "value": ["v"]}, "value", "invalid_request"),
    ({"name": "ok", "value": "v" * (16 * 1024 + 1)}, "value", "invalid_request"),
    # 9,000 characters but 18,000 bytes of UTF-8.
    ({"name": "ok", "value": "é" * 9000}, "value", "value_too_large"),
    ({"name": "ok", "value": "v", "description": "d" * 501}, "description", "invalid_request"),
    ({"name": "ok", "value": "v", "description": None}, "description", "invalid_request"),
    ({"name": "ok", "value": "v", "extra": 1}, "extra", "invalid_request"),
]


async def test_bad_create_bodies_are_400_naming_the_field(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    url = base(tenant.project_id)
    for body, param, code in BAD_CREATES:
        error = assert_error(await client.post(url, json=body, headers=tenant.owner), 400, code)
        assert error["param"] == param, (body if len(str(body)) < 200 else param, error)
    # Exactly at the bounds is fine.
    await create_secret(client, tenant.project_id, tenant.owner, name="n" * 100, value="v")
    await create_secret(client, tenant.project_id, tenant.owner, value="v" * 16 * 1024)
    await create_secret(client, tenant.project_id, tenant.owner, value="é" * 8192)
    await create_secret(client, tenant.project_id, tenant.owner, description="d" * 500)
    for raw in ("[]", "not json", '"string"'):
        response = await client.post(
            url,
            content=raw.encode(),
            headers={**tenant.owner, "Content-Type": "application/json"},
        )
        assert_error(response, 400)
    missing = await client.post(url, headers=tenant.owner)
    assert_error(missing, 400, "invalid_json")
    assert (await client.get(url, headers=tenant.owner)).json()["total"] == 4


async def test_bad_value_and_patch_bodies_are_400(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    secret = await create_secret(client, tenant.project_id, tenant.owner)
    item = f"{base(tenant.project_id)}/{secret['id']}"
    bad_values: list[tuple[Any, str, str]] = [
        ({}, "value", "invalid_request"),
        ({"value": ""}, "value", "invalid_request"),
        ({"value": 1}, "value", "invalid_request"),
        ({"value": "v" * (16 * 1024 + 1)}, "value", "invalid_request"),
        ({"value": "€" * 6000}, "value", "value_too_large"),
        ({"value": "v", "name": "x"}, "name", "invalid_request"),
    ]
    for body, param, code in bad_values:
        error = assert_error(
            await client.put(f"{item}/value", json=body, headers=tenant.owner), 400, code
        )
        assert error["param"] == param
    bad_patches: list[tuple[Any, str]] = [
        ({"description": "d" * 501}, "description"),
        ({"description": 3}, "description"),
        ({"name": "rename"}, "name"),
        ({"value": "sneaky"}, "value"),
    ]
    for body, param in bad_patches:
        error = assert_error(await client.patch(item, json=body, headers=tenant.owner), 400)
        assert error["param"] == param
    # Nothing changed.
    got = (await client.get(item, headers=tenant.owner)).json()
    assert got == secret
    assert await _resolver_reveal(client, tenant.project_id, secret["id"]) != "sneaky"


# ------------------------------------------------------------ tenancy and roles


async def test_another_tenant_gets_404_on_every_route(secrets_client: Client) -> None:
    client = secrets_client
    a = await new_tenant(client)
    b = await new_tenant(client)
    a_value, b_value = plaintext("a"), plaintext("b")
    a_secret = await create_secret(client, a.project_id, a.owner, value=a_value)
    b_secret = await create_secret(client, b.project_id, b.owner, value=b_value)
    a_url, a_item = base(a.project_id), f"{base(a.project_id)}/{a_secret['id']}"

    # B's owner and B's API key on A's project: the project itself is not found.
    for headers in (b.owner, b.key):
        calls = [
            client.get(a_url, headers=headers),
            client.post(a_url, json={"name": "x", "value": "v"}, headers=headers),
            client.get(a_item, headers=headers),
            client.put(f"{a_item}/value", json={"value": "stolen"}, headers=headers),
            client.patch(a_item, json={"description": "x"}, headers=headers),
            client.delete(a_item, headers=headers),
        ]
        for response in await asyncio.gather(*calls):
            assert_error(response, 404, "project_not_found")

    # A's owner naming B's secret under A's project: the secret is not found.
    b_item_under_a = f"{a_url}/{b_secret['id']}"
    missing_under_a = f"{a_url}/{MISSING}"
    for item in (b_item_under_a, missing_under_a):
        for response in [
            await client.get(item, headers=a.owner),
            await client.put(f"{item}/value", json={"value": "stolen"}, headers=a.owner),
            await client.patch(item, json={"description": "x"}, headers=a.owner),
            await client.delete(item, headers=a.owner),
        ]:
            assert_error(response, 404, "secret_not_found")
    # A malformed id does not match a route.
    assert (await client.get(f"{a_url}/not-a-uuid", headers=a.owner)).status_code == 404

    # Nothing of B's changed, and the service API refuses across projects too.
    assert await _resolver_reveal(client, b.project_id, b_secret["id"]) == b_value
    assert (await client.get(base(b.project_id), headers=b.owner)).json()["items"] == [b_secret]
    with pytest.raises(NotFoundError) as raised:
        await _resolver_reveal(client, a.project_id, b_secret["id"])
    assert raised.value.code == "secret_not_found"
    with pytest.raises(NotFoundError):
        await _resolver_reveal(client, a.project_id, MISSING)
    assert await _resolver_reveal(client, a.project_id, a_secret["id"]) == a_value


async def test_members_read_and_writers_write(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    member = await _add_member(client, tenant)
    url = base(tenant.project_id)
    secret = await create_secret(client, tenant.project_id, tenant.owner)
    item = f"{url}/{secret['id']}"

    assert (await client.get(url, headers=member)).json()["items"] == [secret]
    assert (await client.get(item, headers=member)).json() == secret
    for response in [
        await client.post(url, json={"name": "m", "value": "v"}, headers=member),
        await client.put(f"{item}/value", json={"value": "v2"}, headers=member),
        await client.patch(item, json={"description": "m"}, headers=member),
        await client.delete(item, headers=member),
    ]:
        error = assert_error(response, 403, "insufficient_role")
        assert "member" in error["message"]

    # The project's API key (automation) and a platform admin write like the owner.
    by_key = await create_secret(client, tenant.project_id, tenant.key, name="from-key")
    by_admin = await create_secret(client, tenant.project_id, ADMIN, name="from-admin")
    put = await client.put(f"{item}/value", json={"value": "v2"}, headers=tenant.key)
    assert put.status_code == 200, put.text
    for created in (by_key, by_admin):
        response = await client.delete(f"{url}/{created['id']}", headers=ADMIN)
        assert response.status_code == 204, response.text

    # Runtime tokens never reach the Projects API; no credentials is a 401.
    runtime = bearer((await create_runtime_token(client, tenant.project_id, tenant.owner))["token"])
    assert_error(await client.get(url, headers=runtime), 403, "runtime_token_not_allowed")
    assert_error(
        await client.post(url, json={"name": "r", "value": "v"}, headers=runtime),
        403,
        "runtime_token_not_allowed",
    )
    assert_error(await client.get(url), 401)
    assert_error(await client.post(url, json={"name": "anon", "value": "v"}), 401)


async def test_list_paginates_by_name(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    url = base(tenant.project_id)
    names = [f"s{i}" for i in (3, 1, 4, 0, 2)]
    for name in names:
        await create_secret(client, tenant.project_id, tenant.owner, name=name)
    seen: list[str] = []
    for offset in (0, 2, 4):
        page = await client.get(f"{url}?limit=2&offset={offset}", headers=tenant.owner)
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["total"] == 5
        assert (body["limit"], body["offset"]) == (2, offset)
        assert all(set(item) == SECRET_FIELDS for item in body["items"])
        seen += [item["name"] for item in body["items"]]
    assert seen == sorted(names)
    past = (await client.get(f"{url}?offset=10", headers=tenant.owner)).json()
    assert past == {"items": [], "total": 5, "limit": 50, "offset": 10}
    for query in ("limit=0", "limit=501", "offset=-1", "limit=x"):
        assert_error(await client.get(f"{url}?{query}", headers=tenant.owner), 400)


# ------------------------------------------------- custom LLMs that use a secret


async def test_used_by_lists_custom_llms_and_blocks_delete(secrets_client: Client) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    other = await new_tenant(client)
    url = base(tenant.project_id)
    used = await create_secret(client, tenant.project_id, tenant.owner, name="used")
    free = await create_secret(client, tenant.project_id, tenant.owner, name="free")
    async with client_engine(client) as engine:
        zeta = await add_custom_llm(engine, tenant.project_id, name="zeta", secret_id=used["id"])
        alpha = await add_custom_llm(engine, tenant.project_id, name="alpha", secret_id=used["id"])
        await add_custom_llm(engine, tenant.project_id, name="no-secret")
        await add_custom_llm(engine, other.project_id, name="elsewhere")

        users = [{"id": str(alpha), "name": "alpha"}, {"id": str(zeta), "name": "zeta"}]
        listed = (await client.get(url, headers=tenant.owner)).json()["items"]
        assert {item["name"]: item["usedBy"] for item in listed} == {"free": [], "used": users}
        got = (await client.get(f"{url}/{used['id']}", headers=tenant.owner)).json()
        assert got["usedBy"] == users

        error = assert_error(
            await client.delete(f"{url}/{used['id']}", headers=tenant.owner), 409, "secret_in_use"
        )
        assert "'alpha'" in error["message"]
        assert "'zeta'" in error["message"]
        assert "elsewhere" not in error["message"]
        assert (await client.get(f"{url}/{used['id']}", headers=tenant.owner)).status_code == 200
        # Rotating a used secret is fine (that is the point of a secret).
        rotated = await client.put(
            f"{url}/{used['id']}/value", json={"value": plaintext()}, headers=tenant.owner
        )
        assert rotated.status_code == 200, rotated.text
        assert rotated.json()["usedBy"] == users

        await remove_custom_llm(engine, zeta)
        error = assert_error(
            await client.delete(f"{url}/{used['id']}", headers=tenant.owner), 409, "secret_in_use"
        )
        assert "custom LLM 'alpha'" in error["message"]
        await remove_custom_llm(engine, alpha)
    assert (await client.delete(f"{url}/{used['id']}", headers=tenant.owner)).status_code == 204
    assert (await client.delete(f"{url}/{free['id']}", headers=tenant.owner)).status_code == 204


# ---------------------------------------------------------- the service API


async def test_reveal_on_the_request_service_and_bound_ciphertexts(
    secrets_client: Client,
) -> None:
    client = secrets_client
    tenant = await new_tenant(client)
    first, second = plaintext("one"), plaintext("two")
    s1 = await create_secret(client, tenant.project_id, tenant.owner, value=first)
    s2 = await create_secret(client, tenant.project_id, tenant.owner, value=second)
    pid = UUID(tenant.project_id)
    vault = _vault(client)
    async with db_config(client) as config:
        async with ProjectSecretService.new(config=config) as service:
            assert await service.reveal(pid, UUID(s1["id"]), vault) == first
            with pytest.raises(NotFoundError):
                await service.reveal(uuid.uuid4(), UUID(s1["id"]), vault)
        # A ciphertext copied onto another row does not open there.
        async with client_engine(client) as engine:
            token = await stored_token(engine, s1["id"])
            async with engine.begin() as conn:
                await conn.execute(
                    update(ProjectSecret)
                    .where(ProjectSecret.id == UUID(s2["id"]))
                    .values(value_encrypted=token)
                )
        resolver = SecretResolver(config, vault)
        with pytest.raises(SecretUnreadableError) as raised:
            await resolver.reveal(pid, UUID(s2["id"]))
        assert raised.value.status_code == 500
        assert first not in raised.value.message
        assert second not in raised.value.message
        # An app whose keys cannot open the value says so, without naming the key.
        stranger = SecretResolver(config, Vault([new_key("other")]))
        with pytest.raises(SecretUnreadableError) as raised:
            await stranger.reveal(pid, UUID(s1["id"]))
        assert raised.value.code == "secret_unreadable"
        assert "k1" not in raised.value.message


async def _next_event(events: Any) -> dict[str, Any]:
    async with asyncio.timeout(5):
        event: dict[str, Any] = await anext(events)
        return event


async def test_rotation_and_delete_publish_secret_changed(client: Client) -> None:
    """PostgreSQL + Redis: the event reaches another subscriber on the Redis bus."""
    settings = settings_of(client)
    assert settings.redis_url is not None
    redis = build_redis(settings.redis_url)
    bus = RedisEventBus(redis, prefix=f"{settings.redis_prefix}events:")
    tenant = await new_tenant(client)
    url = base(tenant.project_id)
    try:
        async with bus.subscribe(CHANNEL) as events:
            secret = await create_secret(client, tenant.project_id, tenant.owner)
            await client.patch(
                f"{url}/{secret['id']}", json={"description": "d"}, headers=tenant.owner
            )
            new_value = plaintext("rotated")
            rotated = await client.put(
                f"{url}/{secret['id']}/value", json={"value": new_value}, headers=tenant.owner
            )
            assert rotated.status_code == 200
            event = await _next_event(events)
            assert set(event) == {"kind", "projectId", "secretId", "origin", "channel"}
            assert event["kind"] == "secret"
            assert event["projectId"] == tenant.project_id
            assert event["secretId"] == secret["id"]
            assert event["channel"] == CHANNEL
            assert isinstance(event["origin"], str)
            assert event["origin"]
            assert new_value not in json.dumps(event)
            deleted = await client.delete(f"{url}/{secret['id']}", headers=tenant.owner)
            assert deleted.status_code == 204
            gone = await _next_event(events)
            assert gone == event
            # A refused delete and a failed write publish nothing: the next event
            # is the marker.
            await client.delete(f"{url}/{MISSING}", headers=tenant.owner)
            await bus.publish(CHANNEL, {"kind": "marker"})
            assert (await _next_event(events))["kind"] == "marker"
    finally:
        await bus.close()
        await redis.aclose()


# ------------------------------------------------------------------- leak test


def _texts_of(response: Any) -> str:
    headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    return f"{response.status_code}\n{headers}\n{response.text}"


@pytest.mark.parametrize("db", ["postgres", "sqlite"])
async def test_no_value_ever_leaves_in_a_response_or_log(
    db: str,
    make_app: AppFactory,
    pg_settings: Settings,
    sqlite_settings: Settings,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full secrets flow with debug logs and SQL logging (statements and parameters)
    on, then a search for every plaintext in every response and every log line."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    settings = with_settings(
        pg_settings if db == "postgres" else sqlite_settings,
        admin_token=ADMIN_TOKEN,
        log_level="DEBUG",
        log_format="json",
    )
    values: list[str] = []

    def value(tag: str) -> str:
        values.append(plaintext(tag))
        return values[-1]

    seen: list[str] = []
    async with AsyncTestClient(app=make_app(settings)) as client:

        async def call(method: str, path: str, headers: dict[str, str], **kw: Any) -> Any:
            response = await client.request(method, path, headers=headers, **kw)
            seen.append(_texts_of(response))
            return response

        tenant = await new_tenant(client)
        other = await new_tenant(client)
        member = await _add_member(client, tenant)
        url = base(tenant.project_id)

        created = await call(
            "POST", url, tenant.owner, json={"name": "main", "value": value("create")}
        )
        assert created.status_code == 201
        sid = created.json()["id"]
        by_key = await call("POST", url, tenant.key, json={"name": "k", "value": value("key")})
        assert by_key.status_code == 201
        await call("GET", url, tenant.owner)
        await call("GET", url, member)
        await call("GET", f"{url}/{sid}", tenant.owner)
        rotated = await call("PUT", f"{url}/{sid}/value", tenant.owner, json={"value": value("r")})
        assert rotated.status_code == 200
        await call("PATCH", f"{url}/{sid}", tenant.owner, json={"description": "d"})
        # Errors with values in the request.
        dup = await call("POST", url, tenant.owner, json={"name": "main", "value": value("dup")})
        assert dup.status_code == 409
        too_long = value("long") + "x" * (16 * 1024)
        assert (
            await call("POST", url, tenant.owner, json={"name": "l", "value": too_long})
        ).status_code == 400
        wide = value("wide") + "é" * 9000
        assert (
            await call("PUT", f"{url}/{sid}/value", tenant.owner, json={"value": wide})
        ).status_code == 400
        bad_name = value("badname")
        assert (
            await call("POST", url, tenant.owner, json={"name": "bad name", "value": bad_name})
        ).status_code == 400
        assert (
            await call("POST", url, tenant.owner, json={"name": "x", "value": value("u"), "z": 1})
        ).status_code == 400
        assert (
            await call("POST", url, member, json={"name": "m", "value": value("member")})
        ).status_code == 403
        assert (
            await call(
                "PUT", f"{url}/{sid}/value", other.owner, json={"value": value("cross-tenant")}
            )
        ).status_code == 404
        assert (
            await call(
                "PUT", f"{base(other.project_id)}/{sid}/value", other.owner, json={"value": "v"}
            )
        ).status_code == 404
        truncated = f'{{"name": "t", "value": "{value("truncated")}'
        assert (
            await call(
                "POST",
                url,
                {**tenant.owner, "Content-Type": "application/json"},
                content=truncated.encode(),
            )
        ).status_code == 400
        # Used by a custom LLM: the refused delete, then the service API.
        async with client_engine(client) as engine:
            llm = await add_custom_llm(engine, tenant.project_id, name="bob", secret_id=sid)
            assert (await call("DELETE", f"{url}/{sid}", tenant.owner)).status_code == 409
            await call("GET", url, tenant.owner)
            assert await _resolver_reveal(client, tenant.project_id, sid) == values[2]
            # An unreadable value is logged as an error, by id and key id.
            token = await stored_token(engine, sid)
            async with engine.begin() as conn:
                await conn.execute(
                    update(ProjectSecret)
                    .where(ProjectSecret.id == UUID(by_key.json()["id"]))
                    .values(value_encrypted=token)
                )
            with pytest.raises(SecretUnreadableError):
                await _resolver_reveal(client, tenant.project_id, by_key.json()["id"])
            await remove_custom_llm(engine, llm)
        assert (await call("DELETE", f"{url}/{sid}", tenant.owner)).status_code == 204
        await call("GET", f"{url}/{sid}", tenant.owner)
        await call("GET", url, tenant.owner)

    captured = capfd.readouterr()
    records = [r.getMessage() for r in caplog.records]
    records += [repr(r.args) for r in caplog.records]
    logs = "\n".join([captured.out, captured.err, *records])
    # The capture works: our own lines and the SQL (with its ciphertext parameters).
    assert "secret created" in logs
    assert "secret value replaced" in logs
    assert "secret cannot be decrypted" in logs
    assert sid in logs
    assert "project_secrets" in logs
    assert "v1:k1:" in logs
    everything = "\n".join([*seen, logs])
    assert len(values) == 11
    for secret_value in values:
        assert secret_value not in everything, f"a value leaked: {secret_value[:8]}..."
