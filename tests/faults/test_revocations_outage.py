"""Revoked tokens stay refused while Redis, which holds the revocation marks, is down,
and signing in keeps working.

The replica runs on PostgreSQL and a Redis of the test's own. A runtime token is
revoked, a project with a live runtime token is deleted, and one login is logged out;
their marks live in Redis. Redis is then killed: the very next requests (before any
recovery) must still refuse all three, from marks the replica copies out of the
database, while the tokens nobody revoked keep working. Redis then comes back empty:
the marks are written to it again, and the answers do not change.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from litestar.testing import AsyncTestClient

from app.lib.redis_client import build_redis
from app.lib.settings import Settings
from tests.support.api import create_runtime_token, eventually
from tests.support.helpers import assert_error, bearer, login, new_project, register, unique_email
from tests.support.redis_instance import RedisInstance
from tests.support.settings import AppFactory

pytestmark = pytest.mark.faults

RECOVERY_TIMEOUT_SECONDS = 15.0


async def test_revocations_hold_through_a_redis_outage(
    make_app: AppFactory, pg_settings: Settings, redis_server: RedisInstance
) -> None:
    redis = redis_server
    settings = replace(pg_settings, redis_url=redis.url)
    async with AsyncTestClient(app=make_app(settings)) as client:
        email = unique_email("outage")
        await register(client, email)
        ended, alive = await login(client, email), await login(client, email)
        owner = bearer(alive["accessToken"])
        kept_project = (await new_project(client, owner))["id"]
        gone_project = (await new_project(client, owner, name="Gone"))["id"]
        revoked = await create_runtime_token(client, kept_project, owner)
        kept = await create_runtime_token(client, kept_project, owner)
        orphan = await create_runtime_token(client, gone_project, owner)

        response = await client.delete(
            f"/api/projects/{kept_project}/runtime-tokens/{revoked['id']}", headers=owner
        )
        assert response.status_code == 204, response.text
        assert (
            await client.delete(f"/api/projects/{gone_project}", headers=owner)
        ).status_code == 204
        assert (
            await client.post("/api/auth/logout", headers=bearer(ended["accessToken"]))
        ).status_code == 204

        async def assert_revocations_hold() -> None:
            for token in (revoked["token"], orphan["token"]):
                me = await client.get("/api/runtime/me", headers=bearer(token))
                assert_error(me, 401, "token_revoked")
            assert_error(
                await client.get("/api/auth/me", headers=bearer(ended["accessToken"])),
                401,
                "token_revoked",
            )
            assert (
                await client.get("/api/runtime/me", headers=bearer(kept["token"]))
            ).status_code == 200
            assert (await client.get("/api/auth/me", headers=owner)).status_code == 200

        await assert_revocations_hold()

        redis.kill()
        # No wait: the first requests after the kill are the ones an empty local
        # memory would have let through.
        await assert_revocations_hold()
        ready = (await client.get("/readyz")).json()
        assert ready["checks"]["redis"] == "unreachable"
        # Logging in still works (its throttling counts on this replica meanwhile),
        # and so does the new session.
        during = await login(client, email)
        assert (
            await client.get("/api/auth/me", headers=bearer(during["accessToken"]))
        ).status_code == 200

        redis.start()  # empty: every mark it held is gone
        # The replica switches back and writes the database's marks to Redis again.
        marks = [f"revoked:jti:{t['id']}" for t in (revoked, orphan)]
        fresh = build_redis(redis.url)

        async def written_back() -> bool:
            return await fresh.exists(*(settings.redis_prefix + m for m in marks)) == 2

        try:
            await eventually(written_back, within=RECOVERY_TIMEOUT_SECONDS)
        finally:
            await fresh.aclose()
        assert (await client.get("/readyz")).json()["status"] == "ready"
        await assert_revocations_hold()
