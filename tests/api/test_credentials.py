"""Project API keys and runtime tokens: issue, store, list, revoke, authenticate.

Covers the hot-path rules too: keys resolve from memory (a flood of invalid keys
costs a bounded number of database lookups), ``last_used_at`` is written in
batches, and replicas sharing PostgreSQL + Redis agree on keys and revocations.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import re
import secrets
import time
import uuid
from typing import Any

import jwt
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from app.db.models import ApiKey, RuntimeToken
from app.lib.settings import Settings
from app.lib.tokens import TokenService
from tests.support.api import (
    Client,
    create_api_key,
    create_runtime_token,
    db_session,
    eventually,
    resources_of,
    settings_of,
    user_with_id,
)
from tests.support.helpers import assert_error, bearer, new_project, new_user
from tests.support.settings import JWT_SECRET, AppFactory, with_settings

KEY_FORMAT = re.compile(r"^ak-[A-Za-z0-9_-]{43}$")
GOVERNANCE = {"allowedModels", "rpm", "tpm", "budget", "budgetPeriod", "labels"}
KEY_LIST_FIELDS = {
    "id",
    "name",
    "prefix",
    "createdAt",
    "lastUsedAt",
    "revokedAt",
    "expiresAt",
    "spend",
    *GOVERNANCE,
}
TOKEN_LIST_FIELDS = {"id", "name", "expiresAt", "createdAt", "revokedAt", "spend", *GOVERNANCE}
MAX_TOKEN_LIFETIME = 366 * 24 * 3600
MISSING = "00000000-0000-4000-8000-000000000000"


def parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


async def key_row(settings: Settings, key_id: str) -> ApiKey:
    async with db_session(settings) as session:
        row = await session.scalar(select(ApiKey).where(ApiKey.id == uuid.UUID(key_id)))
    assert row is not None
    return row


async def raw_row(settings: Settings, model: Any, row_id: str) -> dict[str, Any]:
    """Every stored column of one row, as the database has it."""
    async with db_session(settings) as session:
        result = await session.execute(
            select(model.__table__).where(model.__table__.c.id == uuid.UUID(row_id))
        )
        return dict(result.mappings().one())


async def owner_and_project(client: Client) -> tuple[dict[str, str], dict[str, Any]]:
    _, headers = await new_user(client, "owner")
    return headers, await new_project(client, headers)


# -------------------------------------------------------------------- API keys


async def test_an_api_key_is_shown_once_and_stored_as_a_hash(any_client: Client) -> None:
    _, headers, user_id = await user_with_id(any_client, "owner")
    project = await new_project(any_client, headers)
    created = await any_client.post(
        f"/api/projects/{project['id']}/api-keys", json={"name": "deploy bot"}, headers=headers
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert set(body) == {"id", "name", "prefix", "key", "createdAt", "expiresAt", *GOVERNANCE}
    assert all(body[field] is None for field in GOVERNANCE)
    secret = body["key"]
    assert KEY_FORMAT.match(secret), secret
    assert len(base64.urlsafe_b64decode(secret[3:] + "=")) == 32
    assert body["name"] == "deploy bot"
    assert body["prefix"] == secret[:10]
    assert secret != body["prefix"]

    row = await key_row(settings_of(any_client), body["id"])
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert row.prefix == secret[:10]
    assert row.project_id == uuid.UUID(project["id"])
    assert row.created_by_id == user_id
    assert row.revoked_at is None
    assert row.last_used_at is None
    stored = await raw_row(settings_of(any_client), ApiKey, body["id"])
    assert not any(secret in v or secret[3:] in v for v in map(str, stored.values())), stored

    other = await create_api_key(any_client, project["id"], headers)
    assert other["key"] != secret
    assert other["id"] != body["id"]
    # Both authenticate the Projects API for their project.
    for key in (secret, other["key"]):
        response = await any_client.get(f"/api/projects/{project['id']}", headers=bearer(key))
        assert response.status_code == 200, response.text


async def test_a_key_without_a_body_gets_an_empty_name(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    response = await any_client.post(f"/api/projects/{project['id']}/api-keys", headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["name"] == ""


@pytest.mark.parametrize(
    ("body", "param"),
    [({"name": "x" * 201}, "name"), ({"name": 3}, "name"), ({"scope": "all"}, "scope")],
)
async def test_api_key_create_validates_its_body(
    any_client: Client, body: dict[str, Any], param: str
) -> None:
    headers, project = await owner_and_project(any_client)
    response = await any_client.post(
        f"/api/projects/{project['id']}/api-keys", json=body, headers=headers
    )
    assert assert_error(response, 400)["param"] == param
    listed = await any_client.get(f"/api/projects/{project['id']}/api-keys", headers=headers)
    assert listed.json()["total"] == 0


async def test_the_key_list_never_contains_a_secret_and_paginates(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    url = f"/api/projects/{project['id']}/api-keys"
    created = [await create_api_key(any_client, project["id"], headers, f"k{i}") for i in range(3)]

    response = await any_client.get(url, headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == 3
    assert body["limit"] == 50
    assert body["offset"] == 0
    assert [k["id"] for k in body["items"]] == [k["id"] for k in reversed(created)]
    for item in body["items"]:
        assert set(item) == KEY_LIST_FIELDS
        assert item["lastUsedAt"] is None
        assert item["revokedAt"] is None
    for key in created:
        assert key["key"] not in response.text
        assert key["key"][10:] not in response.text
    assert {k["prefix"] for k in body["items"]} == {k["prefix"] for k in created}

    page = (await any_client.get(f"{url}?limit=2&offset=2", headers=headers)).json()
    assert page["total"] == 3
    assert page["limit"] == 2
    assert page["offset"] == 2
    assert [k["id"] for k in page["items"]] == [created[0]["id"]]
    assert_error(await any_client.get(f"{url}?limit=501", headers=headers), 400)


async def test_a_revoked_key_is_refused_at_once(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    pid = project["id"]
    doomed = await create_api_key(any_client, pid, headers, "doomed")
    kept = await create_api_key(any_client, pid, headers, "kept")
    assert (await any_client.get("/api/projects", headers=bearer(doomed["key"]))).status_code == 200

    revoked = await any_client.delete(
        f"/api/projects/{pid}/api-keys/{doomed['id']}", headers=headers
    )
    assert revoked.status_code == 204, revoked.text
    assert revoked.content == b""
    for _ in range(3):
        response = await any_client.get("/api/projects", headers=bearer(doomed["key"]))
        error = assert_error(response, 401, "invalid_api_key")
        assert error["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"
    assert (await any_client.get("/api/projects", headers=bearer(kept["key"]))).status_code == 200

    items = (await any_client.get(f"/api/projects/{pid}/api-keys", headers=headers)).json()["items"]
    by_id = {k["id"]: k for k in items}
    revoked_at = by_id[doomed["id"]]["revokedAt"]
    assert revoked_at is not None
    assert by_id[kept["id"]]["revokedAt"] is None

    # Revoking again is harmless and keeps the first revocation time.
    again = await any_client.delete(f"/api/projects/{pid}/api-keys/{doomed['id']}", headers=headers)
    assert again.status_code == 204
    items = (await any_client.get(f"/api/projects/{pid}/api-keys", headers=headers)).json()["items"]
    assert {k["id"]: k for k in items}[doomed["id"]]["revokedAt"] == revoked_at
    assert_error(await any_client.get("/api/projects", headers=bearer(doomed["key"])), 401)

    missing = await any_client.delete(f"/api/projects/{pid}/api-keys/{MISSING}", headers=headers)
    assert_error(missing, 404, "api_key_not_found")


async def test_a_key_may_revoke_itself(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    key = await create_api_key(any_client, project["id"], headers)
    response = await any_client.delete(
        f"/api/projects/{project['id']}/api-keys/{key['id']}", headers=bearer(key["key"])
    )
    assert response.status_code == 204
    assert_error(await any_client.get("/api/projects", headers=bearer(key["key"])), 401)


async def test_a_revoked_key_stays_refused_after_a_restart(
    any_client: Client, make_app: AppFactory
) -> None:
    headers, project = await owner_and_project(any_client)
    key = await create_api_key(any_client, project["id"], headers)
    kept = await create_api_key(any_client, project["id"], headers)
    await any_client.delete(f"/api/projects/{project['id']}/api-keys/{key['id']}", headers=headers)
    async with AsyncTestClient(app=make_app(settings_of(any_client))) as restarted:
        assert_error(
            await restarted.get("/api/projects", headers=bearer(key["key"])), 401, "invalid_api_key"
        )
        assert (
            await restarted.get("/api/projects", headers=bearer(kept["key"]))
        ).status_code == 200


@pytest.mark.parametrize(
    "credential",
    [
        "ak-",
        "ak-short",
        "ak-" + "A" * 43,
        "ak-" + secrets.token_urlsafe(32) + "x",
        "ak-" + "x" * 5000,
    ],
)
async def test_malformed_or_unknown_keys_are_401(any_client: Client, credential: str) -> None:
    response = await any_client.get("/api/projects", headers=bearer(credential))
    error = assert_error(response, 401)
    assert error["code"] in ("invalid_api_key", "invalid_token")
    assert credential not in response.text


# ------------------------------------------------------------------ last used


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_last_used_is_written_in_a_batch_not_per_request(
    backend: str, make_app: AppFactory, pg_settings: Settings, sqlite_settings: Settings
) -> None:
    settings = pg_settings if backend == "postgres" else sqlite_settings
    async with AsyncTestClient(app=make_app(settings)) as client:
        assert settings_of(client).last_used_flush_seconds >= 10
        headers, project = await owner_and_project(client)
        used = await create_api_key(client, project["id"], headers, "used")
        idle = await create_api_key(client, project["id"], headers, "idle")
        before = datetime.datetime.now(datetime.UTC)
        for _ in range(5):
            response = await client.get(
                f"/api/projects/{project['id']}", headers=bearer(used["key"])
            )
            assert response.status_code == 200
        # Remembered in memory, not yet written.
        assert resources_of(client).last_used.pending == 1
        assert (await key_row(settings, used["id"])).last_used_at is None
        listed = await client.get(f"/api/projects/{project['id']}/api-keys", headers=headers)
        assert all(k["lastUsedAt"] is None for k in listed.json()["items"])
    after = datetime.datetime.now(datetime.UTC)

    # Shutting down flushed it.
    last_used = (await key_row(settings, used["id"])).last_used_at
    assert last_used is not None
    assert before - datetime.timedelta(seconds=1) <= last_used <= after
    assert (await key_row(settings, idle["id"])).last_used_at is None

    async with AsyncTestClient(app=make_app(settings)) as client:
        items = await client.get(f"/api/projects/{project['id']}/api-keys", headers=headers)
        by_id = {k["id"]: k for k in items.json()["items"]}
        assert parse_time(by_id[used["id"]]["lastUsedAt"]) == last_used
        assert by_id[idle["id"]]["lastUsedAt"] is None


async def test_last_used_is_flushed_on_an_interval(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    settings = with_settings(pg_settings, last_used_flush_seconds=0.2)
    async with AsyncTestClient(app=make_app(settings)) as client:
        headers, project = await owner_and_project(client)
        key = await create_api_key(client, project["id"], headers)
        assert (await client.get("/api/projects", headers=bearer(key["key"]))).status_code == 200

        async def written() -> bool:
            return (await key_row(settings, key["id"])).last_used_at is not None

        await eventually(written, within=5.0, interval=0.05)
        assert resources_of(client).last_used.pending == 0


# ----------------------------------------------------------- invalid-key floods


async def test_a_flood_of_invalid_keys_is_rejected_from_memory(client: Client) -> None:
    headers, project = await owner_and_project(client)
    valid = await create_api_key(client, project["id"], headers)
    index = resources_of(client).api_key_index
    lookups_before = index.database_lookups
    started = time.monotonic()
    attempts = 1000
    for _ in range(attempts):
        response = await client.get(
            "/api/projects", headers=bearer("ak-" + secrets.token_urlsafe(32))
        )
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "invalid_api_key"
    elapsed = time.monotonic() - started
    spent = index.database_lookups - lookups_before
    # A token bucket of 20 lookups/s (burst 20): the budget grows with time, never
    # with the number of attempts.
    assert spent <= 20 + 20 * elapsed + 1, (spent, elapsed)
    # Without the bucket every attempt would cost a lookup. (The exact budget is
    # checked with a fake clock in tests/unit/test_api_key_index.py; here the
    # elapsed time, and so the budget, depends on how loaded the machine is.)
    assert spent < attempts, (spent, elapsed)

    # A valid key still resolves from memory, without a lookup.
    lookups_before = index.database_lookups
    response = await client.get("/api/projects", headers=bearer(valid["key"]))
    assert response.status_code == 200
    assert index.database_lookups == lookups_before


async def test_one_invalid_key_repeated_costs_at_most_one_lookup(any_client: Client) -> None:
    index = resources_of(any_client).api_key_index
    before = index.database_lookups
    credential = "ak-" + secrets.token_urlsafe(32)
    for _ in range(100):
        assert_error(
            await any_client.get("/api/projects", headers=bearer(credential)),
            401,
            "invalid_api_key",
        )
    assert index.database_lookups - before <= 1


# -------------------------------------------------------------- cross-replica


async def test_keys_created_and_revoked_on_one_replica_apply_on_another(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with (
        AsyncTestClient(app=make_app(pg_settings)) as replica_a,
        AsyncTestClient(app=make_app(pg_settings)) as replica_b,
    ):
        headers, project = await owner_and_project(replica_a)
        index_b = resources_of(replica_b).api_key_index
        lookups_before = index_b.database_lookups

        key = await create_api_key(replica_a, project["id"], headers)
        key_hash = hashlib.sha256(key["key"].encode()).hexdigest()

        async def known_on_b() -> bool:
            return key_hash in index_b

        # Delivered by an event, without B asking the database.
        await eventually(known_on_b, within=5.0)
        on_b = await replica_b.get(f"/api/projects/{project['id']}", headers=bearer(key["key"]))
        assert on_b.status_code == 200, on_b.text
        assert on_b.json()["role"] == "api_key"
        assert index_b.database_lookups == lookups_before

        revoked = await replica_a.delete(
            f"/api/projects/{project['id']}/api-keys/{key['id']}", headers=headers
        )
        assert revoked.status_code == 204

        async def refused_on_b() -> bool:
            response = await replica_b.get("/api/projects", headers=bearer(key["key"]))
            return response.status_code == 401

        await eventually(refused_on_b, within=5.0)
        assert key_hash not in index_b
        assert_error(
            await replica_b.get("/api/projects", headers=bearer(key["key"])), 401, "invalid_api_key"
        )

        # Deleting the project on A drops its keys on B too.
        other = await create_api_key(replica_a, project["id"], headers)
        other_hash = hashlib.sha256(other["key"].encode()).hexdigest()

        async def other_known_on_b() -> bool:
            return other_hash in index_b

        await eventually(other_known_on_b, within=5.0)
        assert (
            await replica_a.delete(f"/api/projects/{project['id']}", headers=headers)
        ).status_code == 204

        async def other_refused_on_b() -> bool:
            response = await replica_b.get("/api/projects", headers=bearer(other["key"]))
            return response.status_code == 401

        await eventually(other_refused_on_b, within=5.0)


async def test_a_runtime_token_revoked_on_one_replica_is_refused_on_another(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with (
        AsyncTestClient(app=make_app(pg_settings)) as replica_a,
        AsyncTestClient(app=make_app(pg_settings)) as replica_b,
    ):
        headers, project = await owner_and_project(replica_a)
        token = await create_runtime_token(replica_a, project["id"], headers)
        kept = await create_runtime_token(replica_a, project["id"], headers)
        assert (
            await replica_b.get("/api/runtime/me", headers=bearer(token["token"]))
        ).status_code == 200

        revoked = await replica_a.delete(
            f"/api/projects/{project['id']}/runtime-tokens/{token['id']}", headers=headers
        )
        assert revoked.status_code == 204
        # The revocation lives in the shared StateStore: no delay at all.
        for replica in (replica_b, replica_a):
            response = await replica.get("/api/runtime/me", headers=bearer(token["token"]))
            assert_error(response, 401, "token_revoked")
        assert (
            await replica_b.get("/api/runtime/me", headers=bearer(kept["token"]))
        ).status_code == 200


async def test_a_replica_started_later_knows_existing_keys(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with AsyncTestClient(app=make_app(pg_settings)) as replica_a:
        headers, project = await owner_and_project(replica_a)
        key = await create_api_key(replica_a, project["id"], headers)
        async with AsyncTestClient(app=make_app(pg_settings)) as replica_b:
            key_hash = hashlib.sha256(key["key"].encode()).hexdigest()
            assert key_hash in resources_of(replica_b).api_key_index
            response = await replica_b.get("/api/projects", headers=bearer(key["key"]))
            assert response.status_code == 200


# -------------------------------------------------------------- runtime tokens


async def test_a_runtime_token_is_a_project_scoped_jwt(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    started = int(time.time())
    response = await any_client.post(
        f"/api/projects/{project['id']}/runtime-tokens",
        json={"name": "agent", "expiresInSeconds": 3600},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"id", "name", "token", "expiresAt", "createdAt", *GOVERNANCE}
    assert body["name"] == "agent"
    claims = jwt.decode(
        body["token"], JWT_SECRET, algorithms=["HS256"], audience="runtime", issuer="arona"
    )
    assert claims["aud"] == "runtime"
    assert claims["sub"] == project["id"]
    assert claims["jti"] == body["id"]
    assert claims["exp"] - claims["iat"] == 3600
    assert started - 1 <= claims["iat"] <= time.time() + 1
    assert parse_time(body["expiresAt"]).timestamp() == claims["exp"]

    me = await any_client.get("/api/runtime/me", headers=bearer(body["token"]))
    assert me.status_code == 200, me.text
    assert me.json() == {"projectId": project["id"], "tokenId": body["id"]}

    async with db_session(settings_of(any_client)) as session:
        row = await session.scalar(
            select(RuntimeToken).where(RuntimeToken.id == uuid.UUID(body["id"]))
        )
    assert row is not None
    assert row.project_id == uuid.UUID(project["id"])
    assert row.expires_at.timestamp() == claims["exp"]
    stored = await raw_row(settings_of(any_client), RuntimeToken, body["id"])
    assert body["token"] not in str(stored)


async def test_a_runtime_token_defaults_to_the_configured_lifetime(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    for body in (None, {}, {"name": "default", "expiresInSeconds": None}):
        token = await any_client.post(
            f"/api/projects/{project['id']}/runtime-tokens", json=body, headers=headers
        )
        assert token.status_code == 201, token.text
        claims = jwt.decode(token.json()["token"], options={"verify_signature": False})
        assert claims["exp"] - claims["iat"] == settings_of(any_client).runtime_token_ttl_seconds


@pytest.mark.parametrize("seconds", [60, MAX_TOKEN_LIFETIME])
async def test_runtime_token_lifetime_bounds_are_inclusive(
    any_client: Client, seconds: int
) -> None:
    headers, project = await owner_and_project(any_client)
    token = await create_runtime_token(any_client, project["id"], headers, expiresInSeconds=seconds)
    claims = jwt.decode(token["token"], options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == seconds


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"expiresInSeconds": 59}, "expiresInSeconds"),
        ({"expiresInSeconds": 0}, "expiresInSeconds"),
        ({"expiresInSeconds": -60}, "expiresInSeconds"),
        ({"expiresInSeconds": MAX_TOKEN_LIFETIME + 1}, "expiresInSeconds"),
        ({"expiresInSeconds": 3600.5}, "expiresInSeconds"),
        ({"expiresInSeconds": True}, "expiresInSeconds"),
        ({"expires_in_seconds": 3600}, "expires_in_seconds"),
        ({"name": "x" * 201}, "name"),
    ],
)
async def test_runtime_token_create_validates_its_body(
    any_client: Client, body: dict[str, Any], param: str
) -> None:
    headers, project = await owner_and_project(any_client)
    response = await any_client.post(
        f"/api/projects/{project['id']}/runtime-tokens", json=body, headers=headers
    )
    error = assert_error(response, 400)
    assert error["param"] == param, error
    listed = await any_client.get(f"/api/projects/{project['id']}/runtime-tokens", headers=headers)
    assert listed.json()["total"] == 0


async def test_runtime_tokens_list_and_revoke(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    pid = project["id"]
    url = f"/api/projects/{pid}/runtime-tokens"
    tokens = [await create_runtime_token(any_client, pid, headers, name=f"t{i}") for i in range(3)]

    listed = await any_client.get(url, headers=headers)
    assert listed.status_code == 200
    body = listed.json()
    assert body["total"] == 3
    assert [t["id"] for t in body["items"]] == [t["id"] for t in reversed(tokens)]
    assert all(set(t) == TOKEN_LIST_FIELDS and t["revokedAt"] is None for t in body["items"])
    assert all(t["token"] not in listed.text for t in tokens)
    page = (await any_client.get(f"{url}?limit=1&offset=1", headers=headers)).json()
    assert [t["id"] for t in page["items"]] == [tokens[1]["id"]]
    assert page["total"] == 3

    doomed = tokens[0]
    assert (await any_client.delete(f"{url}/{doomed['id']}", headers=headers)).status_code == 204
    assert_error(
        await any_client.get("/api/runtime/me", headers=bearer(doomed["token"])),
        401,
        "token_revoked",
    )
    for survivor in tokens[1:]:
        me = await any_client.get("/api/runtime/me", headers=bearer(survivor["token"]))
        assert me.status_code == 200
    items = {t["id"]: t for t in (await any_client.get(url, headers=headers)).json()["items"]}
    revoked_at = items[doomed["id"]]["revokedAt"]
    assert revoked_at is not None

    assert (await any_client.delete(f"{url}/{doomed['id']}", headers=headers)).status_code == 204
    items = {t["id"]: t for t in (await any_client.get(url, headers=headers)).json()["items"]}
    assert items[doomed["id"]]["revokedAt"] == revoked_at
    assert_error(
        await any_client.delete(f"{url}/{MISSING}", headers=headers), 404, "runtime_token_not_found"
    )


async def test_a_revoked_runtime_token_stays_refused_after_a_restart(
    sqlite_settings: Settings, make_app: AppFactory
) -> None:
    """The embedded default keeps revocations in memory; start-up restores them."""
    async with AsyncTestClient(app=make_app(sqlite_settings)) as client:
        headers, project = await owner_and_project(client)
        revoked = await create_runtime_token(client, project["id"], headers)
        kept = await create_runtime_token(client, project["id"], headers)
        response = await client.delete(
            f"/api/projects/{project['id']}/runtime-tokens/{revoked['id']}", headers=headers
        )
        assert response.status_code == 204
        assert_error(await client.get("/api/runtime/me", headers=bearer(revoked["token"])), 401)

    async with AsyncTestClient(app=make_app(sqlite_settings)) as restarted:
        response = await restarted.get("/api/runtime/me", headers=bearer(revoked["token"]))
        assert_error(response, 401, "token_revoked")
        response = await restarted.get("/api/runtime/me", headers=bearer(kept["token"]))
        assert response.status_code == 200
        assert response.json()["tokenId"] == kept["id"]


async def test_the_runtime_api_accepts_runtime_tokens_only(any_client: Client) -> None:
    headers, project = await owner_and_project(any_client)
    key = await create_api_key(any_client, project["id"], headers)
    assert_error(await any_client.get("/api/runtime/me"), 401, "missing_credentials")
    assert_error(
        await any_client.get("/api/runtime/me", headers=headers), 403, "runtime_token_required"
    )
    assert_error(
        await any_client.get("/api/runtime/me", headers=bearer(key["key"])),
        403,
        "runtime_token_required",
    )
    assert_error(await any_client.get("/api/runtime/me", headers=bearer("not.a.jwt")), 401)


async def test_forged_and_expired_runtime_tokens_are_refused(any_client: Client) -> None:
    _headers, project = await owner_and_project(any_client)
    jti = str(uuid.uuid4())
    forged = TokenService("another-secret-" + "y" * 40).issue(
        subject=project["id"], audience="runtime", ttl_seconds=600, jti=jti
    )
    assert_error(
        await any_client.get("/api/runtime/me", headers=bearer(forged.token)), 401, "invalid_token"
    )
    an_hour_ago = TokenService(JWT_SECRET, clock=lambda: time.time() - 3600)
    expired = an_hour_ago.issue(subject=project["id"], audience="runtime", ttl_seconds=60, jti=jti)
    assert_error(
        await any_client.get("/api/runtime/me", headers=bearer(expired.token)), 401, "token_expired"
    )
    # A runtime token's jti must be a token id.
    odd = TokenService(JWT_SECRET).issue(
        subject=project["id"], audience="runtime", ttl_seconds=600, jti="not-a-uuid"
    )
    assert_error(await any_client.get("/api/runtime/me", headers=bearer(odd.token)), 401)
    # Other audiences are not accepted.
    refresh_like = TokenService(JWT_SECRET).issue(
        subject=project["id"], audience="refresh", ttl_seconds=600, jti=jti
    )
    assert_error(
        await any_client.get("/api/runtime/me", headers=bearer(refresh_like.token)),
        401,
        "invalid_token",
    )
