"""Auth security: forged and misused tokens, login rate limits, races between requests."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from app.lib.tokens import TokenService
from app.server.app import create_app
from tests.support.auth import (
    CountingHasher,
    cheap_hasher,
    claims_of,
    fresh_database,
    http_login,
    http_register,
)
from tests.support.helpers import (
    assert_error,
    bearer,
    login,
    new_project,
    new_user,
    register,
    unique_email,
)
from tests.support.live_server import live_server
from tests.support.settings import JWT_SECRET, AppFactory

OTHER_SECRET = "another-secret-" + "y" * 40


@pytest.fixture(params=["postgres", "sqlite"])
def backend_settings(
    request: pytest.FixtureRequest, pg_settings: Settings, sqlite_settings: Settings
) -> Settings:
    """PostgreSQL + Redis, or SQLite + in-memory state (shared session databases)."""
    return pg_settings if request.param == "postgres" else sqlite_settings


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def valid_claims(user_id: str, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": user_id,
        "aud": "user",
        "iss": "arona",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "jti": uuid.uuid4().hex,
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def signed(claims: dict[str, Any], secret: str = JWT_SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, secret, algorithm=algorithm)


def swap_payload(token: str, **changes: Any) -> str:
    """Edit a signed token's claims but keep its original signature."""
    header, payload, signature = token.split(".")
    claims = json.loads(b64url_decode(payload))
    claims.update(changes)
    return ".".join([header, b64url(json.dumps(claims).encode()), signature])


def flip_signature(token: str) -> str:
    header, payload, signature = token.split(".")
    raw = bytearray(b64url_decode(signature))
    raw[len(raw) // 2] ^= 0x01
    return ".".join([header, payload, b64url(bytes(raw))])


def unsigned(claims: dict[str, Any]) -> str:
    header = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{header}.{b64url(json.dumps(claims).encode())}."


Forger = Callable[[str, str, str], str]
"""(user id, a genuine access token of that user, another user's id) -> bad token."""

FORGED: dict[str, tuple[Forger, str]] = {
    "expired": (
        lambda uid, _t, _o: (
            TokenService(JWT_SECRET, clock=lambda: time.time() - 3600)
            .issue(subject=uid, audience="user", ttl_seconds=900)
            .token
        ),
        "token_expired",
    ),
    "expired-a-second-ago": (
        lambda uid, _t, _o: (
            TokenService(JWT_SECRET, clock=lambda: time.time() - 901)
            .issue(subject=uid, audience="user", ttl_seconds=900)
            .token
        ),
        "token_expired",
    ),
    "issued-in-the-future": (
        lambda uid, _t, _o: (
            TokenService(JWT_SECRET, clock=lambda: time.time() + 3600)
            .issue(subject=uid, audience="user", ttl_seconds=900)
            .token
        ),
        "invalid_token",
    ),
    "not-before-in-the-future": (
        lambda uid, _t, _o: signed(valid_claims(uid, nbf=int(time.time()) + 600)),
        "invalid_token",
    ),
    "other-secret": (
        lambda uid, _t, _o: (
            TokenService(OTHER_SECRET).issue(subject=uid, audience="user", ttl_seconds=900).token
        ),
        "invalid_token",
    ),
    "other-issuer": (
        lambda uid, _t, _o: (
            TokenService(JWT_SECRET, issuer="someone-else")
            .issue(subject=uid, audience="user", ttl_seconds=900)
            .token
        ),
        "invalid_token",
    ),
    "refresh-audience": (
        lambda uid, _t, _o: signed(valid_claims(uid, aud="refresh")),
        "invalid_token",
    ),
    "admin-audience": (lambda uid, _t, _o: signed(valid_claims(uid, aud="admin")), "invalid_token"),
    "audience-list": (lambda uid, _t, _o: signed(valid_claims(uid, aud=["user"])), "invalid_token"),
    "no-audience": (lambda uid, _t, _o: signed(valid_claims(uid, aud=None)), "invalid_token"),
    "alg-none": (lambda uid, _t, _o: unsigned(valid_claims(uid)), "invalid_token"),
    "hs512": (lambda uid, _t, _o: signed(valid_claims(uid), algorithm="HS512"), "invalid_token"),
    "swapped-subject": (lambda _u, token, other: swap_payload(token, sub=other), "invalid_token"),
    "extended-expiry": (
        lambda _u, token, _o: swap_payload(token, exp=int(time.time()) + 10**6),
        "invalid_token",
    ),
    "flipped-signature": (lambda _u, token, _o: flip_signature(token), "invalid_token"),
    "no-signature": (lambda _u, token, _o: token.rsplit(".", 1)[0] + ".", "invalid_token"),
    "two-segments": (lambda _u, token, _o: token.rsplit(".", 1)[0], "invalid_token"),
    "missing-jti": (lambda uid, _t, _o: signed(valid_claims(uid, jti=None)), "invalid_token"),
    "missing-exp": (lambda uid, _t, _o: signed(valid_claims(uid, exp=None)), "invalid_token"),
    "string-exp": (
        lambda uid, _t, _o: signed(valid_claims(uid, exp=str(int(time.time()) + 600))),
        "invalid_token",
    ),
    "boolean-exp": (lambda uid, _t, _o: signed(valid_claims(uid, exp=True)), "invalid_token"),
    "subject-not-a-uuid": (
        lambda _u, _t, _o: signed(valid_claims("not-a-uuid")),
        "invalid_token",
    ),
    "subject-of-nobody": (
        lambda _u, _t, _o: signed(valid_claims(str(uuid.uuid4()))),
        "invalid_token",
    ),
    "session-not-a-uuid": (
        lambda uid, _t, _o: signed(valid_claims(uid, fid="not-a-uuid")),
        "invalid_token",
    ),
    "garbage": (lambda _u, _t, _o: "abc.def.ghi", "invalid_token"),
    "oversized": (lambda _u, token, _o: token + "A" * 5000, "invalid_token"),
}


async def test_a_token_forged_with_the_real_secret_is_accepted(any_client):
    """The control for the cases below: the crafting itself is sound."""
    user = await register(any_client)
    token = signed(valid_claims(user["id"]))
    response = await any_client.get("/api/auth/me", headers=bearer(token))
    assert response.status_code == 200, response.text
    assert response.json()["id"] == user["id"]


@pytest.mark.parametrize("case", sorted(FORGED))
async def test_bad_access_tokens_are_401(any_client, case):
    email = unique_email("victim")
    user = await register(any_client, email)
    other = await register(any_client)
    genuine = (await login(any_client, email))["accessToken"]
    forge, code = FORGED[case]
    token = forge(user["id"], genuine, other["id"])
    response = await any_client.get("/api/auth/me", headers=bearer(token))
    error = assert_error(response, 401, code)
    assert error["type"] == "authentication_error"
    assert response.headers.get("www-authenticate") == "Bearer"


async def test_an_access_token_expires_on_time(make_app, pg_settings):
    # 3 s, not 1: on a loaded machine registering and logging in can take a second,
    # and the first use below must fall inside the token's lifetime.
    settings = replace(pg_settings, access_token_ttl_seconds=3)
    async with AsyncTestClient(app=make_app(settings)) as client:
        email = unique_email("short")
        await register(client, email)
        tokens = await login(client, email)
        assert (await client.get("/api/auth/me", headers=bearer(tokens["accessToken"]))).is_success
        await asyncio.sleep(claims_of(tokens["accessToken"])["exp"] - time.time() + 0.1)
        expired = await client.get("/api/auth/me", headers=bearer(tokens["accessToken"]))
        assert_error(expired, 401, "token_expired")
        # The refresh token outlives it and gets a fresh one.
        refreshed = await client.post(
            "/api/auth/refresh", json={"refreshToken": tokens["refreshToken"]}
        )
        assert refreshed.status_code == 200, refreshed.text


async def test_logout_is_seen_by_every_replica(make_app, pg_settings):
    """Two apps on one database and one Redis prefix behave as one service."""
    async with (
        AsyncTestClient(app=make_app(pg_settings)) as one,
        AsyncTestClient(app=make_app(pg_settings)) as two,
    ):
        email = unique_email("replicas")
        await register(one, email)
        tokens = await login(one, email)
        assert (await two.get("/api/auth/me", headers=bearer(tokens["accessToken"]))).is_success
        logout = await one.post("/api/auth/logout", headers=bearer(tokens["accessToken"]))
        assert logout.status_code == 204
        revoked = await two.get("/api/auth/me", headers=bearer(tokens["accessToken"]))
        assert_error(revoked, 401, "token_revoked")
        stale = await two.post("/api/auth/refresh", json={"refreshToken": tokens["refreshToken"]})
        assert_error(stale, 401, "refresh_token_revoked")


# --- one kind of credential where another is expected ---------------------------------


async def test_refresh_token_is_not_an_access_token(any_client):
    email = unique_email("confuse")
    await register(any_client, email)
    tokens = await login(any_client, email)
    response = await any_client.get("/api/auth/me", headers=bearer(tokens["refreshToken"]))
    assert_error(response, 401, "invalid_token")


async def test_access_token_is_not_a_refresh_token(any_client):
    email = unique_email("confuse")
    await register(any_client, email)
    tokens = await login(any_client, email)
    response = await any_client.post(
        "/api/auth/refresh", json={"refreshToken": tokens["accessToken"]}
    )
    assert_error(response, 401, "invalid_refresh_token")
    # The failed attempt did not spend or revoke anything.
    assert (await any_client.get("/api/auth/me", headers=bearer(tokens["accessToken"]))).is_success
    ok = await any_client.post("/api/auth/refresh", json={"refreshToken": tokens["refreshToken"]})
    assert ok.status_code == 200, ok.text


async def test_runtime_token_and_api_key_get_403_on_user_endpoints(any_client):
    _, headers = await new_user(any_client, "owner")
    project = await new_project(any_client, headers)
    runtime = await any_client.post(
        f"/api/projects/{project['id']}/runtime-tokens", json={"name": "rt"}, headers=headers
    )
    assert runtime.status_code == 201, runtime.text
    api_key = await any_client.post(
        f"/api/projects/{project['id']}/api-keys", json={"name": "ci"}, headers=headers
    )
    assert api_key.status_code == 201, api_key.text
    credentials = {"runtime": runtime.json()["token"], "api_key": api_key.json()["key"]}

    # Both are valid credentials (controls) ...
    whoami = await any_client.get("/api/runtime/me", headers=bearer(credentials["runtime"]))
    assert whoami.status_code == 200, whoami.text
    project_via_key = await any_client.get(
        f"/api/projects/{project['id']}", headers=bearer(credentials["api_key"])
    )
    assert project_via_key.status_code == 200, project_via_key.text

    # ... but neither is a user.
    for credential in credentials.values():
        me = await any_client.get("/api/auth/me", headers=bearer(credential))
        error = assert_error(me, 403, "user_token_required")
        assert error["type"] == "permission_error"
        logout = await any_client.post("/api/auth/logout", headers=bearer(credential))
        assert_error(logout, 403, "user_token_required")
        refresh = await any_client.post("/api/auth/refresh", json={"refreshToken": credential})
        assert_error(refresh, 401, "invalid_refresh_token")
    # Logging out with them did not revoke them.
    whoami = await any_client.get("/api/runtime/me", headers=bearer(credentials["runtime"]))
    assert whoami.status_code == 200, whoami.text


async def test_user_access_token_is_not_a_runtime_token(any_client):
    _, headers = await new_user(any_client, "not-runtime")
    response = await any_client.get("/api/runtime/me", headers=headers)
    assert_error(response, 403, "runtime_token_required")


async def test_unknown_api_key_on_me_is_401(any_client):
    response = await any_client.get("/api/auth/me", headers=bearer("ak-" + "x" * 43))
    assert_error(response, 401, "invalid_api_key")


async def test_operator_admin_token_is_not_a_user(make_app, pg_settings):
    admin_token = "operator-" + uuid.uuid4().hex
    async with AsyncTestClient(app=make_app(replace(pg_settings, admin_token=admin_token))) as c:
        assert_error(
            await c.get("/api/auth/me", headers=bearer(admin_token)), 403, "user_token_required"
        )
        assert_error(
            await c.post("/api/auth/logout", headers=bearer(admin_token)),
            403,
            "user_token_required",
        )


# --- login rate limits ----------------------------------------------------------------


async def test_login_is_rate_limited_per_email(backend_settings):
    settings = replace(backend_settings, login_max_attempts=3, login_window_seconds=120)
    hasher = cheap_hasher(CountingHasher)
    try:
        async with AsyncTestClient(app=create_app(settings, password_hasher=hasher)) as client:
            email = unique_email("limited")
            await register(client, email)
            for _ in range(3):
                wrong = await http_login(client, email, "wrong password")
                assert_error(wrong, 401, "invalid_credentials")

            hasher.verified.clear()
            # Even the right password is refused once the window is full ...
            limited = await http_login(client, email)
            error = assert_error(limited, 429, "rate_limited")
            assert error["type"] == "rate_limit_error"
            retry_after = int(limited.headers["retry-after"])
            assert 1 <= retry_after <= 120
            # ... for every spelling of the address ...
            assert_error(await http_login(client, f"  {email.upper()} "), 429, "rate_limited")
            # ... and refusing costs no argon2 work.
            assert hasher.verified == []

            # Other accounts are not affected.
            other = unique_email("free")
            await register(client, other)
            assert (await http_login(client, other)).status_code == 200
    finally:
        hasher.close()


async def test_login_rate_limit_counts_unknown_emails_too(backend_settings, make_app):
    settings = replace(backend_settings, login_max_attempts=2)
    async with AsyncTestClient(app=make_app(settings)) as client:
        ghost = unique_email("ghost")
        for _ in range(2):
            assert_error(await http_login(client, ghost), 401, "invalid_credentials")
        # Registered meanwhile or not, the address is out of attempts for the window.
        await register(client, ghost)
        assert_error(await http_login(client, ghost), 429, "rate_limited")


async def test_login_rate_limit_window_expires(backend_settings, make_app):
    # The second login must land inside the window the first opened: 3 s leaves
    # room for a slow first login (argon2, a token write) on a loaded machine.
    settings = replace(backend_settings, login_max_attempts=1, login_window_seconds=3)
    async with AsyncTestClient(app=make_app(settings)) as client:
        email = unique_email("window")
        await register(client, email)
        assert (await http_login(client, email)).status_code == 200
        limited = await http_login(client, email)
        assert_error(limited, 429, "rate_limited")
        assert 1 <= int(limited.headers["retry-after"]) <= 3
        await asyncio.sleep(3.2)
        assert (await http_login(client, email)).status_code == 200


async def test_login_rate_limit_holds_across_replicas(make_app, pg_settings):
    settings = replace(pg_settings, login_max_attempts=4)
    async with (
        AsyncTestClient(app=make_app(settings)) as one,
        AsyncTestClient(app=make_app(settings)) as two,
    ):
        email = unique_email("cluster")
        await register(one, email)
        for replica in (one, two, one, two):
            assert_error(await http_login(replica, email, "wrong password"), 401)
        assert_error(await http_login(one, email), 429, "rate_limited")
        assert_error(await http_login(two, email), 429, "rate_limited")


async def test_login_is_rate_limited_per_client_address(backend_settings, make_app):
    # Per address the allowance is five times the per-email one (several people can
    # share an address); 2 per email makes it 10 per address.
    settings = replace(backend_settings, login_max_attempts=2)
    async with live_server(make_app(settings)) as url:
        here = httpx.AsyncClient(
            base_url=url, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.1")
        )
        elsewhere = httpx.AsyncClient(
            base_url=url, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        )
        async with here, elsewhere:
            email = unique_email("client")
            assert (await http_register(here, email)).status_code == 201
            for _ in range(10):
                response = await http_login(here, unique_email("spray"), "guess password")
                assert_error(response, 401, "invalid_credentials")
            # A fresh account with the right password, but from the same address.
            limited = await http_login(here, email)
            assert_error(limited, 429, "rate_limited")
            assert int(limited.headers["retry-after"]) >= 1
            # Another address is not affected.
            allowed = await http_login(elsewhere, email)
            assert allowed.status_code == 200, allowed.text


# --- races (a real server: AsyncTestClient never overlaps two requests) -----------------


async def test_concurrent_refresh_with_one_token_succeeds_once(backend_settings, make_app):
    async with (
        live_server(make_app(backend_settings)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        email = unique_email("race")
        assert (await http_register(client, email)).status_code == 201
        for _ in range(3):
            tokens = (await http_login(client, email)).json()
            responses = await asyncio.gather(
                *(
                    client.post("/api/auth/refresh", json={"refreshToken": tokens["refreshToken"]})
                    for _ in range(8)
                )
            )
            winners = [r for r in responses if r.status_code == 200]
            assert len(winners) == 1, [r.status_code for r in responses]
            for loser in (r for r in responses if r.status_code != 200):
                assert_error(loser, 401, "refresh_token_reused")
            # The duplicates count as reuse, so the whole family is revoked, including
            # the link the winner just got, whichever order the requests finished in.
            after = await client.post(
                "/api/auth/refresh", json={"refreshToken": winners[0].json()["refreshToken"]}
            )
            assert_error(after, 401, "refresh_token_revoked")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_concurrent_first_registrations_make_exactly_one_admin(
    make_app: AppFactory, tmp_path: Path, kind: str
):
    async with (
        fresh_database(kind, tmp_path) as settings,
        live_server(make_app(settings)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        responses = await asyncio.gather(
            *(http_register(client, unique_email(f"first{i}")) for i in range(6))
        )
        assert [r.status_code for r in responses] == [201] * 6, [r.text for r in responses]
        admins = [r.json() for r in responses if r.json()["isAdmin"]]
        assert len(admins) == 1, [r.json() for r in responses]
        later = await http_register(client, unique_email("later"))
        assert later.json()["isAdmin"] is False


async def test_concurrent_registrations_of_one_email_create_one_user(backend_settings, make_app):
    async with (
        live_server(make_app(backend_settings)) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        email = unique_email("twins")
        spellings = [email, email.upper(), f" {email}", email.title()] * 2
        responses = await asyncio.gather(*(http_register(client, s) for s in spellings))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [201] + [409] * (len(spellings) - 1), [r.text for r in responses]
        for response in responses:
            if response.status_code == 409:
                assert assert_error(response, 409, "email_taken")["param"] == "email"
        assert (await http_login(client, email)).status_code == 200


async def test_body_over_the_limit_without_a_content_length_is_413(pg_settings, make_app):
    async def chunks() -> Any:
        yield b'{"email": "a@example.com", "password": "'
        for _ in range(10):
            yield b"p" * 200
        yield b'"}'

    settings = replace(pg_settings, max_body_bytes=1024)
    async with live_server(make_app(settings)) as url, httpx.AsyncClient(base_url=url) as client:
        response = await client.post(
            "/api/auth/login", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert "content-length" not in response.request.headers
        assert response.request.headers.get("transfer-encoding") == "chunked"
        assert_error(response, 413, "request_too_large")
