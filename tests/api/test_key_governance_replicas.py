"""Key governance across replicas sharing PostgreSQL + Redis: a PATCH made on one
replica is what every other replica enforces, through the writer's own invalidation
(the API key index's ``updated`` event, the runtime token policy cache's hint)."""

from __future__ import annotations

import datetime
import hashlib

from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from tests.support.api import create_api_key, create_runtime_token, eventually, resources_of
from tests.support.helpers import assert_error, bearer, new_project, new_user
from tests.support.settings import AppFactory


def _in(seconds: float) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return moment.isoformat().replace("+00:00", "Z")


async def test_a_key_patched_on_one_replica_is_enforced_on_another(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with (
        AsyncTestClient(app=make_app(pg_settings)) as replica_a,
        AsyncTestClient(app=make_app(pg_settings)) as replica_b,
    ):
        _, headers = await new_user(replica_a, "owner")
        project = await new_project(replica_a, headers)
        key = await create_api_key(replica_a, project["id"], headers)
        key_hash = hashlib.sha256(key["key"].encode()).hexdigest()
        index_b = resources_of(replica_b).api_key_index

        async def known_on_b() -> bool:
            return key_hash in index_b

        await eventually(known_on_b, within=5.0)
        me = f"/api/projects/{project['id']}"
        assert (await replica_b.get(me, headers=bearer(key["key"]))).status_code == 200

        patched = await replica_a.patch(
            f"{me}/api-keys/{key['id']}",
            json={"expiresAt": _in(2), "allowedModels": ["gpt-*"], "rpm": 7},
            headers=headers,
        )
        assert patched.status_code == 200, patched.text

        async def limits_on_b() -> bool:
            held = await index_b.resolve(key_hash)
            return held is not None and held.policy.rpm == 7

        await eventually(limits_on_b, within=5.0)
        held = await index_b.resolve(key_hash)
        assert held is not None
        assert held.policy.allows("gpt-4o")
        assert not held.policy.allows("claude")

        async def expired_on_b() -> bool:
            return (await replica_b.get(me, headers=bearer(key["key"]))).status_code == 401

        await eventually(expired_on_b, within=15.0)
        assert_error(await replica_b.get(me, headers=bearer(key["key"])), 401, "api_key_expired")
        assert_error(await replica_a.get(me, headers=bearer(key["key"])), 401, "api_key_expired")

        # Extended on A: usable on B again as soon as the event arrives.
        extended = await replica_a.patch(
            f"{me}/api-keys/{key['id']}", json={"expiresAt": _in(3600)}, headers=headers
        )
        assert extended.status_code == 200, extended.text

        async def usable_on_b() -> bool:
            return (await replica_b.get(me, headers=bearer(key["key"]))).status_code == 200

        await eventually(usable_on_b, within=5.0)


async def test_a_runtime_token_shortened_on_one_replica_expires_on_another(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with (
        AsyncTestClient(app=make_app(pg_settings)) as replica_a,
        AsyncTestClient(app=make_app(pg_settings)) as replica_b,
    ):
        _, headers = await new_user(replica_a, "owner")
        project = await new_project(replica_a, headers)
        token = await create_runtime_token(replica_a, project["id"], headers)
        runtime = bearer(token["token"])
        # B reads and caches the token's policy on its first use.
        assert (await replica_b.get("/api/runtime/me", headers=runtime)).status_code == 200

        shortened = await replica_a.patch(
            f"/api/projects/{project['id']}/runtime-tokens/{token['id']}",
            json={"expiresAt": _in(2)},
            headers=headers,
        )
        assert shortened.status_code == 200, shortened.text

        async def expired_on_b() -> bool:
            response = await replica_b.get("/api/runtime/me", headers=runtime)
            return response.status_code == 401

        await eventually(expired_on_b, within=15.0)
        assert_error(await replica_b.get("/api/runtime/me", headers=runtime), 401, "token_expired")
