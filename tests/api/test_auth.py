"""The auth API: register, login, refresh, logout, me — behaviour and bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import argon2
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from app.server.app import create_app
from tests.support.auth import (
    CountingHasher,
    cheap_hasher,
    claims_of,
    expire_refresh_token,
    fresh_database,
    set_disabled,
    stored_password_hash,
)
from tests.support.helpers import PASSWORD, assert_error, bearer, login, register, unique_email
from tests.support.settings import AppFactory

USER_FIELDS = {"id", "email", "name", "isAdmin", "disabled", "createdAt"}
TOKEN_FIELDS = {"accessToken", "refreshToken", "expiresIn", "refreshExpiresIn", "tokenType"}


def settings_of(client: AsyncTestClient[Litestar]) -> Settings:
    settings: Settings = client.app.state.resources.settings
    return settings


async def refresh(client: AsyncTestClient[Litestar], token: str) -> Any:
    return await client.post("/api/auth/refresh", json={"refreshToken": token})


async def me(client: AsyncTestClient[Litestar], access_token: str) -> Any:
    return await client.get("/api/auth/me", headers=bearer(access_token))


# --- register -------------------------------------------------------------------------


async def test_register_returns_the_user_without_secrets(any_client):
    await register(any_client)  # so the next one is certainly not the first user
    email = unique_email("reg")
    response = await any_client.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD, "name": "  Ada  "}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == USER_FIELDS
    assert body["email"] == email
    assert body["name"] == "Ada"
    assert body["disabled"] is False
    assert body["isAdmin"] is False
    assert body["createdAt"].endswith(("Z", "+00:00"))
    assert PASSWORD not in response.text
    assert "argon2" not in response.text


async def test_register_normalizes_the_email(any_client):
    local = unique_email("MiXeD").split("@")[0]
    response = await any_client.post(
        "/api/auth/register",
        json={"email": f"  {local}@Example.COM ", "password": PASSWORD},
    )
    assert response.status_code == 201, response.text
    assert response.json()["email"] == f"{local.lower()}@example.com"
    # Any spelling of the address logs in.
    tokens = await login(any_client, f"{local.upper()}@EXAMPLE.com")
    me_response = await me(any_client, tokens["accessToken"])
    assert me_response.json()["email"] == f"{local.lower()}@example.com"


async def test_register_stores_an_argon2id_hash(client):
    email = unique_email("hash")
    await register(client, email)
    stored = await stored_password_hash(settings_of(client), email)
    assert stored.startswith("$argon2id$")
    assert PASSWORD not in stored


@pytest.mark.parametrize("variant", ["same", "upper", "mixed", "padded"])
async def test_register_duplicate_email_is_409(any_client, variant):
    email = unique_email("dup")
    await register(any_client, email)
    again = {
        "same": email,
        "upper": email.upper(),
        "mixed": email[:3].upper() + email[3:],
        "padded": f"  {email}  ",
    }[variant]
    response = await any_client.post(
        "/api/auth/register", json={"email": again, "password": "another password"}
    )
    error = assert_error(response, 409, "email_taken")
    assert error["param"] == "email"
    assert error["type"] == "conflict_error"
    # The original account is untouched: its password still works, the new one does not.
    await login(any_client, email)
    wrong = await any_client.post(
        "/api/auth/login", json={"email": email, "password": "another password"}
    )
    assert_error(wrong, 401, "invalid_credentials")


async def test_register_when_closed_is_403_and_creates_nothing(make_app, pg_settings):
    closed = replace(pg_settings, registration_open=False)
    email = unique_email("closed")
    async with AsyncTestClient(app=make_app(closed)) as client:
        response = await client.post(
            "/api/auth/register", json={"email": email, "password": PASSWORD}
        )
        error = assert_error(response, 403, "registration_closed")
        assert error["type"] == "permission_error"
        attempt = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
        assert_error(attempt, 401, "invalid_credentials")
    # Opening registration again lets the same address register: nothing was stored.
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        await register(client, email)


@pytest.mark.parametrize(
    "email",
    ["no-at-sign", "user@localhost", "@example.com", "a b@example.com", "user@", "   "],
)
async def test_register_rejects_invalid_emails(any_client, email):
    response = await any_client.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD}
    )
    error = assert_error(response, 400)
    assert error["param"] == "email"
    assert error["code"] in ("invalid_email", "invalid_request")


@pytest.mark.parametrize("kind", ["fresh-sqlite", "fresh-postgres"])
async def test_first_user_becomes_admin_and_only_the_first(make_app, tmp_path: Path, kind):
    async with (
        fresh_database(kind.removeprefix("fresh-"), tmp_path) as settings,
        AsyncTestClient(app=make_app(settings)) as client,
    ):
        first_email = unique_email("first")
        first = await register(client, first_email)
        assert first["isAdmin"] is True
        second = await register(client, unique_email("second"))
        assert second["isAdmin"] is False
        third = await register(client, unique_email("third"))
        assert third["isAdmin"] is False
        tokens = await login(client, first_email)
        me_response = await me(client, tokens["accessToken"])
        assert me_response.json()["isAdmin"] is True


# --- login ----------------------------------------------------------------------------


async def test_login_returns_a_15_minute_access_token_and_an_opaque_refresh_token(any_client):
    email = unique_email("login")
    user = await register(any_client, email)
    response = await any_client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == TOKEN_FIELDS
    assert body["tokenType"] == "Bearer"
    assert body["expiresIn"] == 15 * 60
    assert body["refreshExpiresIn"] == settings_of(any_client).refresh_token_ttl_seconds
    claims = claims_of(body["accessToken"])
    assert claims["sub"] == user["id"]
    assert claims["aud"] == "user"
    assert claims["iss"] == "arona"
    assert claims["exp"] - claims["iat"] == 15 * 60
    # The refresh token is an opaque random string, not a JWT anyone could decode.
    assert body["refreshToken"].startswith("rt-")
    assert body["refreshToken"].count(".") == 0
    assert len(body["refreshToken"]) >= 40
    me_response = await me(any_client, body["accessToken"])
    assert me_response.status_code == 200, me_response.text
    assert me_response.json() == user


async def test_login_access_ttl_follows_settings(make_app, pg_settings):
    settings = replace(pg_settings, access_token_ttl_seconds=60)
    async with AsyncTestClient(app=make_app(settings)) as client:
        email = unique_email("ttl")
        await register(client, email)
        tokens = await login(client, email)
        assert tokens["expiresIn"] == 60
        claims = claims_of(tokens["accessToken"])
        assert claims["exp"] - claims["iat"] == 60


async def test_each_login_is_a_separate_session(any_client):
    email = unique_email("sessions")
    await register(any_client, email)
    one = await login(any_client, email)
    two = await login(any_client, email)
    assert one["accessToken"] != two["accessToken"]
    assert one["refreshToken"] != two["refreshToken"]
    assert claims_of(one["accessToken"])["jti"] != claims_of(two["accessToken"])["jti"]


async def test_wrong_password_and_unknown_email_get_the_same_error(make_app, pg_settings):
    hasher = cheap_hasher(CountingHasher)
    try:
        async with AsyncTestClient(app=create_app(pg_settings, password_hasher=hasher)) as client:
            email = unique_email("known")
            await register(client, email)

            hasher.verified.clear()
            wrong = await client.post(
                "/api/auth/login", json={"email": email, "password": "not the password"}
            )
            wrong_verifications = list(hasher.verified)

            hasher.verified.clear()
            unknown = await client.post(
                "/api/auth/login",
                json={"email": unique_email("nobody"), "password": "not the password"},
            )
            unknown_verifications = list(hasher.verified)
    finally:
        hasher.close()

    wrong_error = assert_error(wrong, 401, "invalid_credentials")
    unknown_error = assert_error(unknown, 401, "invalid_credentials")
    assert wrong_error == unknown_error
    assert wrong_error["type"] == "authentication_error"
    assert wrong.headers.get("www-authenticate") == unknown.headers.get("www-authenticate")
    # Both paths spend exactly one real argon2id verification, at the same cost, so
    # neither the answer nor the work tells which addresses have accounts.
    assert len(wrong_verifications) == 1
    assert len(unknown_verifications) == 1
    assert wrong_verifications[0] == unknown_verifications[0]
    assert wrong_verifications[0].type is argon2.Type.ID


async def test_login_with_a_correct_password_spends_one_verification(pg_settings):
    hasher = cheap_hasher(CountingHasher)
    try:
        async with AsyncTestClient(app=create_app(pg_settings, password_hasher=hasher)) as client:
            email = unique_email("ok")
            await register(client, email)
            hasher.verified.clear()
            await login(client, email)
            assert len(hasher.verified) == 1
    finally:
        hasher.close()


async def test_login_rehashes_a_password_hashed_with_old_parameters(make_app, pg_settings):
    email = unique_email("rehash")
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        await register(client, email)
    before = argon2.extract_parameters(await stored_password_hash(pg_settings, email))

    stronger = cheap_hasher(time_cost=2)
    try:
        async with AsyncTestClient(app=create_app(pg_settings, password_hasher=stronger)) as client:
            await login(client, email)
            after = argon2.extract_parameters(await stored_password_hash(pg_settings, email))
            # Still the same password afterwards.
            await login(client, email)
    finally:
        stronger.close()
    assert before.time_cost == 1
    assert after.time_cost == 2
    assert after.type is argon2.Type.ID


async def test_disabled_user_cannot_log_in(any_client):
    email = unique_email("disabled")
    await register(any_client, email)
    await set_disabled(settings_of(any_client), email, True)
    error = assert_error(
        await any_client.post("/api/auth/login", json={"email": email, "password": PASSWORD}),
        401,
        "account_disabled",
    )
    assert error["type"] == "authentication_error"
    # A wrong password does not reveal that the account exists and is disabled.
    assert_error(
        await any_client.post("/api/auth/login", json={"email": email, "password": "x" * 12}),
        401,
        "invalid_credentials",
    )
    await set_disabled(settings_of(any_client), email, False)
    await login(any_client, email)


# --- me -------------------------------------------------------------------------------


async def test_me_without_credentials_is_401(any_client):
    response = await any_client.get("/api/auth/me")
    assert_error(response, 401, "missing_credentials")
    assert response.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize(
    "header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer    ", "Token abc", "bearer-abc"]
)
async def test_me_with_a_malformed_authorization_header_is_401(any_client, header):
    response = await any_client.get("/api/auth/me", headers={"Authorization": header})
    assert_error(response, 401, "invalid_authorization")


async def test_bearer_scheme_is_case_insensitive(any_client):
    email = unique_email("scheme")
    await register(any_client, email)
    tokens = await login(any_client, email)
    response = await any_client.get(
        "/api/auth/me", headers={"Authorization": f"bearer {tokens['accessToken']}"}
    )
    assert response.status_code == 200, response.text


async def test_disabled_user_cannot_use_an_existing_access_token(any_client):
    email = unique_email("disabled-token")
    await register(any_client, email)
    tokens = await login(any_client, email)
    assert (await me(any_client, tokens["accessToken"])).status_code == 200
    await set_disabled(settings_of(any_client), email, True)
    assert_error(await me(any_client, tokens["accessToken"]), 401, "account_disabled")
    logout = await any_client.post("/api/auth/logout", headers=bearer(tokens["accessToken"]))
    assert_error(logout, 401, "account_disabled")


# --- refresh --------------------------------------------------------------------------


async def test_refresh_rotates_the_pair(any_client):
    email = unique_email("rotate")
    user = await register(any_client, email)
    first = await login(any_client, email)
    response = await refresh(any_client, first["refreshToken"])
    assert response.status_code == 200, response.text
    second = response.json()
    assert set(second) == TOKEN_FIELDS
    assert second["refreshToken"] != first["refreshToken"]
    assert second["accessToken"] != first["accessToken"]
    assert second["expiresIn"] == 15 * 60
    assert claims_of(second["accessToken"])["sub"] == user["id"]
    assert (await me(any_client, second["accessToken"])).json()["id"] == user["id"]
    # The chain goes on.
    third = await refresh(any_client, second["refreshToken"])
    assert third.status_code == 200, third.text


async def test_reusing_a_spent_refresh_token_revokes_the_family(any_client):
    email = unique_email("reuse")
    await register(any_client, email)
    first = await login(any_client, email)
    other_session = await login(any_client, email)
    second = (await refresh(any_client, first["refreshToken"])).json()

    # Replaying the spent link (a stolen copy, say) is refused ...
    error = assert_error(await refresh(any_client, first["refreshToken"]), 401)
    assert error["code"] == "refresh_token_reused"
    # ... and kills the link the legitimate holder got from the rotation.
    assert_error(await refresh(any_client, second["refreshToken"]), 401, "refresh_token_revoked")
    assert_error(await refresh(any_client, first["refreshToken"]), 401, "refresh_token_reused")
    # Every access token minted from the family is refused too: the thief's and
    # the holder's alike, without waiting for their 15 minutes to run out.
    for access in (first["accessToken"], second["accessToken"]):
        assert_error(await me(any_client, access), 401, "token_revoked")
    # Another login of the same user is a different family and carries on.
    assert (await me(any_client, other_session["accessToken"])).status_code == 200
    untouched = await refresh(any_client, other_session["refreshToken"])
    assert untouched.status_code == 200, untouched.text


async def test_unknown_refresh_token_is_401(any_client):
    assert_error(await refresh(any_client, "rt-" + "A" * 43), 401, "invalid_refresh_token")
    assert_error(await refresh(any_client, "garbage"), 401, "invalid_refresh_token")


async def test_expired_refresh_token_is_401(any_client):
    email = unique_email("expired-rt")
    await register(any_client, email)
    tokens = await login(any_client, email)
    await expire_refresh_token(settings_of(any_client), tokens["refreshToken"])
    assert_error(await refresh(any_client, tokens["refreshToken"]), 401, "refresh_token_expired")


async def test_refresh_of_a_disabled_user_is_refused_and_ends_the_session(any_client):
    email = unique_email("disabled-rt")
    await register(any_client, email)
    tokens = await login(any_client, email)
    await set_disabled(settings_of(any_client), email, True)
    assert_error(await refresh(any_client, tokens["refreshToken"]), 401, "account_disabled")
    # Re-enabling the account does not bring the old session back.
    await set_disabled(settings_of(any_client), email, False)
    response = await refresh(any_client, tokens["refreshToken"])
    assert response.status_code == 401, response.text
    await login(any_client, email)


# --- logout ---------------------------------------------------------------------------


async def test_logout_revokes_the_access_token_and_the_session(any_client):
    email = unique_email("logout")
    await register(any_client, email)
    tokens = await login(any_client, email)
    other = await login(any_client, email)
    response = await any_client.post("/api/auth/logout", headers=bearer(tokens["accessToken"]))
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert_error(await me(any_client, tokens["accessToken"]), 401, "token_revoked")
    # The refresh token of the session ends with it, even though it was not sent.
    assert_error(await refresh(any_client, tokens["refreshToken"]), 401, "refresh_token_revoked")
    # Logging out twice with the same token is refused.
    again = await any_client.post("/api/auth/logout", headers=bearer(tokens["accessToken"]))
    assert_error(again, 401, "token_revoked")
    # Other sessions of the same user stay signed in.
    assert (await me(any_client, other["accessToken"])).status_code == 200
    assert (await refresh(any_client, other["refreshToken"])).status_code == 200


async def test_logout_with_a_refresh_token_revokes_that_family_too(any_client):
    email = unique_email("logout-rt")
    await register(any_client, email)
    tokens = await login(any_client, email)
    rotated = (await refresh(any_client, tokens["refreshToken"])).json()
    response = await any_client.post(
        "/api/auth/logout",
        json={"refreshToken": rotated["refreshToken"]},
        headers=bearer(rotated["accessToken"]),
    )
    assert response.status_code == 204, response.text
    assert_error(await me(any_client, rotated["accessToken"]), 401, "token_revoked")
    # The access token minted before the rotation belongs to the same login.
    assert_error(await me(any_client, tokens["accessToken"]), 401, "token_revoked")
    assert_error(await refresh(any_client, rotated["refreshToken"]), 401, "refresh_token_revoked")


async def test_logout_can_end_another_session_of_the_same_user(any_client):
    email = unique_email("logout-other")
    await register(any_client, email)
    here = await login(any_client, email)
    there = await login(any_client, email)
    response = await any_client.post(
        "/api/auth/logout",
        json={"refreshToken": there["refreshToken"]},
        headers=bearer(here["accessToken"]),
    )
    assert response.status_code == 204, response.text
    assert_error(await refresh(any_client, there["refreshToken"]), 401, "refresh_token_revoked")
    assert_error(await refresh(any_client, here["refreshToken"]), 401, "refresh_token_revoked")
    # The other session's access token ends with its family.
    assert_error(await me(any_client, there["accessToken"]), 401, "token_revoked")


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_ended_logins_stay_ended_after_a_restart(
    backend: str, make_app: AppFactory, pg_settings: Settings, sqlite_settings: Settings
) -> None:
    """The embedded default keeps revocation marks in memory; a restart rebuilds them
    from the database (refresh families revoked recently enough), so neither a
    logged-out token nor one of a login ended by refresh-token reuse comes back."""
    # PostgreSQL with in-memory state as well: the marks must come from the database.
    settings = replace(pg_settings, redis_url=None) if backend == "postgres" else sqlite_settings
    async with AsyncTestClient(app=make_app(settings)) as client:
        email = unique_email("restart")
        await register(client, email)
        out = await login(client, email)
        reused = await login(client, email)
        alive = await login(client, email)
        assert (
            await client.post("/api/auth/logout", headers=bearer(out["accessToken"]))
        ).status_code == 204
        await refresh(client, reused["refreshToken"])
        assert_error(await refresh(client, reused["refreshToken"]), 401, "refresh_token_reused")

    async with AsyncTestClient(app=make_app(settings)) as client:
        assert_error(await me(client, out["accessToken"]), 401, "token_revoked")
        assert_error(await me(client, reused["accessToken"]), 401, "token_revoked")
        assert (await me(client, alive["accessToken"])).status_code == 200


async def test_logout_ignores_someone_elses_refresh_token(any_client):
    mine, theirs = unique_email("mine"), unique_email("theirs")
    await register(any_client, mine)
    await register(any_client, theirs)
    my_tokens = await login(any_client, mine)
    their_tokens = await login(any_client, theirs)
    response = await any_client.post(
        "/api/auth/logout",
        json={"refreshToken": their_tokens["refreshToken"]},
        headers=bearer(my_tokens["accessToken"]),
    )
    assert response.status_code == 204, response.text
    # Their session is unaffected.
    assert (await me(any_client, their_tokens["accessToken"])).status_code == 200
    assert (await refresh(any_client, their_tokens["refreshToken"])).status_code == 200


async def test_logout_needs_an_access_token(any_client):
    assert_error(await any_client.post("/api/auth/logout"), 401, "missing_credentials")
    email = unique_email("logout-rt-only")
    await register(any_client, email)
    tokens = await login(any_client, email)
    # A refresh token is not an access token.
    response = await any_client.post("/api/auth/logout", headers=bearer(tokens["refreshToken"]))
    assert_error(response, 401, "invalid_token")
    assert (await refresh(any_client, tokens["refreshToken"])).status_code == 200


# --- bad input ------------------------------------------------------------------------

VALID_REGISTER = {"email": "someone@example.com", "password": PASSWORD}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/api/auth/register", {"email": 5, "password": PASSWORD}, "email"),
        ("/api/auth/register", {"email": "a@example.com", "password": 12345678}, "password"),
        ("/api/auth/register", {**VALID_REGISTER, "name": None}, "name"),
        ("/api/auth/register", {**VALID_REGISTER, "name": ["Ada"]}, "name"),
        ("/api/auth/register", {"email": "a@example.com"}, "password"),
        ("/api/auth/register", {"password": PASSWORD}, "email"),
        ("/api/auth/register", {**VALID_REGISTER, "isAdmin": True}, "isAdmin"),
        ("/api/auth/register", {**VALID_REGISTER, "is_admin": True}, "is_admin"),
        ("/api/auth/register", {"email": "a@example.com", "password": "short"}, "password"),
        ("/api/auth/register", {"email": "a@example.com", "password": "p" * 1025}, "password"),
        ("/api/auth/register", {**VALID_REGISTER, "name": "n" * 201}, "name"),
        (
            "/api/auth/register",
            {"email": "a" * 320 + "@example.com", "password": PASSWORD},
            "email",
        ),
        ("/api/auth/login", {"email": "a@example.com", "password": ""}, "password"),
        ("/api/auth/login", {"email": ["a@example.com"], "password": PASSWORD}, "email"),
        ("/api/auth/login", {"email": "a@example.com", "password": None}, "password"),
        ("/api/auth/login", {"email": "a@example.com"}, "password"),
        ("/api/auth/login", {"password": PASSWORD}, "email"),
        ("/api/auth/login", {"email": "a@example.com", "password": "x", "remember": 1}, "remember"),
        ("/api/auth/login", {"email": "a@example.com", "password": "p" * 1025}, "password"),
        ("/api/auth/refresh", {}, "refreshToken"),
        ("/api/auth/refresh", {"refreshToken": ""}, "refreshToken"),
        ("/api/auth/refresh", {"refreshToken": 5}, "refreshToken"),
        ("/api/auth/refresh", {"refreshToken": "rt-" + "a" * 510}, "refreshToken"),
        ("/api/auth/refresh", {"refresh_token": "rt-abc"}, "refresh_token"),
        ("/api/auth/refresh", {"refreshToken": "rt-abc", "extra": True}, "extra"),
    ],
)
async def test_invalid_fields_are_400_naming_the_field(any_client, path, body, param):
    response = await any_client.post(path, json=body)
    error = assert_error(response, 400)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert param in error["message"], error


@pytest.mark.parametrize(
    ("body", "param"),
    [({"refreshToken": 5}, "refreshToken"), ({"everything": True}, "everything")],
)
async def test_logout_body_is_validated(any_client, body, param):
    email = unique_email("logout-body")
    await register(any_client, email)
    tokens = await login(any_client, email)
    response = await any_client.post(
        "/api/auth/logout", json=body, headers=bearer(tokens["accessToken"])
    )
    error = assert_error(response, 400)
    assert error["param"] == param
    # The refused logout did not log anyone out.
    assert (await me(any_client, tokens["accessToken"])).status_code == 200


@pytest.mark.parametrize("path", ["/api/auth/register", "/api/auth/login", "/api/auth/refresh"])
@pytest.mark.parametrize(
    "raw",
    [b'{"email": ', b"{bad json}", b'{"email": "a@example.com"} trailing', b"\xff\xfe{}"],
)
async def test_malformed_json_is_400_invalid_json(any_client, path, raw):
    response = await any_client.post(
        path, content=raw, headers={"Content-Type": "application/json"}
    )
    error = assert_error(response, 400, "invalid_json")
    assert error["param"] is None
    assert "JSON" in error["message"]


@pytest.mark.parametrize("path", ["/api/auth/register", "/api/auth/login", "/api/auth/refresh"])
async def test_missing_body_is_400(any_client, path):
    response = await any_client.post(path, headers={"Content-Type": "application/json"})
    error = assert_error(response, 400, "invalid_json")
    assert error["param"] is None
    assert "body" in error["message"]


@pytest.mark.parametrize("path", ["/api/auth/register", "/api/auth/login", "/api/auth/refresh"])
@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"42", b"null", b"true"])
async def test_a_body_that_is_not_an_object_is_400(any_client, path, raw):
    response = await any_client.post(
        path, content=raw, headers={"Content-Type": "application/json"}
    )
    error = assert_error(response, 400)
    # The whole body is wrong, not one field; the internal argument name must not leak.
    assert error["param"] is None
    assert "object" in error["message"]


@pytest.fixture
async def small_body_client(make_app: AppFactory, pg_settings: Settings) -> AsyncIterator[Any]:
    async with AsyncTestClient(app=make_app(replace(pg_settings, max_body_bytes=1024))) as client:
        yield client


@pytest.mark.parametrize("path", ["/api/auth/register", "/api/auth/login", "/api/auth/refresh"])
async def test_body_over_the_limit_is_413(small_body_client, path):
    body = {"email": "a@example.com", "password": "p" * 2000, "refreshToken": "r" * 10}
    response = await small_body_client.post(path, json=body)
    assert_error(response, 413, "request_too_large")


async def test_body_just_under_the_limit_is_processed(small_body_client):
    body = {"email": unique_email("limit"), "password": "p" * 900}
    response = await small_body_client.post("/api/auth/login", json=body)
    assert_error(response, 401, "invalid_credentials")
