"""Redis stopped and restarted under load, with two real replicas on a Redis of the
test's own: serving goes on from local state, each project's quota policy decides
(fail open: served uncounted; fail closed: 503), readiness says degraded, and when
Redis returns the replicas use it again and re-sync what they missed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.cluster import (
    ADMIN,
    Cluster,
    Tenant,
    eventually,
    new_tenant,
    register_backend,
    running_cluster,
    unique,
    wait_healthy_everywhere,
)
from tests.support.helpers import bearer
from tests.support.redis_instance import RedisInstance

pytestmark = pytest.mark.faults

OUTAGE_SECONDS = 3.0
RESYNC_BOUND_SECONDS = 10.0


@dataclass(frozen=True)
class Outcome:
    phase: str
    tenant: str
    replica: int
    status: int
    code: str | None


@contextlib.asynccontextmanager
async def cluster_on(redis: RedisInstance, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(
        tmp_path,
        size=2,
        # Re-sync happens on recovery, not by the minute-long safety-net reloads.
        extra_env={"ARONA_REDIS_URL": redis.url},
    ) as cluster:
        yield cluster


async def limit(cluster: Cluster, tenant: Tenant, *, fail_closed: bool) -> None:
    response = await cluster.a.put(
        f"/api/admin/projects/{tenant.project_id}/quota",
        json={"perMinute": None, "perDay": 100_000, "perMonth": None, "failClosed": fail_closed},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text


async def chat(client: httpx.AsyncClient, tenant: Tenant, model: str) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers=bearer(tenant.api_key),
    )


async def readiness(client: httpx.AsyncClient) -> tuple[int, int, str, str]:
    """(plain status, load balancer's status, status word, the Redis check)."""
    strict = await client.get("/readyz")
    response = await client.get("/readyz", params={"allow_degraded": "true"})
    body = response.json()
    return strict.status_code, response.status_code, body["status"], body["checks"]["redis"]


async def test_serving_rides_out_a_redis_outage_and_resyncs_after(tmp_path: Path) -> None:
    redis = RedisInstance(tmp_path)
    redis.start()
    try:
        fake = FakeOpenAI(unique("up"), models=[unique("m")])
        model = fake.control.models[0]
        # Registered only during the outage: its change event is lost.
        late = FakeOpenAI(unique("late"), models=[unique("m")])
        async with (
            serve_asgi(fake) as url,
            serve_asgi(late) as late_url,
            cluster_on(redis, tmp_path) as cluster,
        ):
            await register_backend(cluster.a, fake.name, url)
            await wait_healthy_everywhere(cluster, fake.name)
            tenants = {"open": await new_tenant(cluster.a), "closed": await new_tenant(cluster.a)}
            await limit(cluster, tenants["open"], fail_closed=False)
            await limit(cluster, tenants["closed"], fail_closed=True)
            for client in cluster.http:
                for tenant in tenants.values():
                    assert (await chat(client, tenant, model)).status_code == 200

            outcomes: list[Outcome] = []
            phase = "before"
            stop = asyncio.Event()

            async def load(tenant_name: str, replica: int) -> None:
                client = cluster.http[replica]
                while not stop.is_set():
                    sent_in = phase
                    response = await chat(client, tenants[tenant_name], model)
                    code = None
                    if response.status_code != 200:
                        code = response.json()["error"]["code"]
                    # A call that straddles a phase change belongs to neither phase.
                    seen_in = phase if phase == sent_in else "settling"
                    outcomes.append(
                        Outcome(seen_in, tenant_name, replica, response.status_code, code)
                    )
                    await asyncio.sleep(0.02)

            workers = [
                asyncio.create_task(load(name, replica)) for name in tenants for replica in (0, 1)
            ]
            try:
                await asyncio.sleep(1.0)
                redis.kill()
                phase = "settling"  # requests in flight at the kill
                await asyncio.sleep(0.5)
                phase = "outage"
                for client in cluster.http:
                    assert await readiness(client) == (503, 200, "degraded", "unreachable")
                # A change made during the outage: its event is lost, the other
                # replica must pick it up when Redis returns.
                await register_backend(cluster.a, late.name, late_url)
                await asyncio.sleep(OUTAGE_SECONDS)
                redis.start()
                phase = "recovering"

                async def ready_everywhere() -> bool:
                    for client in cluster.http:
                        if await readiness(client) != (200, 200, "ready", "ok"):
                            return False
                    return True

                await eventually(ready_everywhere, RESYNC_BOUND_SECONDS)

                async def late_backend_on_b() -> bool:
                    response = await cluster.b.get(
                        f"/api/admin/backends/{late.name}", headers=ADMIN
                    )
                    reason: str = response.json()["health"]["reason"]
                    return reason != "not loaded on this replica"

                resynced = await eventually(late_backend_on_b, RESYNC_BOUND_SECONDS)
                print(f"backend registered during the outage loaded on B {resynced:.2f}s after")

                async def closed_served_again() -> bool:
                    return any(
                        o.phase == "after" and o.tenant == "closed" and o.status == 200
                        for o in outcomes
                    )

                phase = "after"
                await eventually(closed_served_again, RESYNC_BOUND_SECONDS)
                await asyncio.sleep(1.0)
            finally:
                stop.set()
                await asyncio.gather(*workers)

            tally = Counter((o.phase, o.tenant, o.status, o.code) for o in outcomes)
            print("outcomes:", dict(sorted(tally.items(), key=str)))
            # The fail-open project was served throughout: no error at any phase.
            assert [o for o in outcomes if o.tenant == "open" and o.status != 200] == []
            outage = [o for o in outcomes if o.phase == "outage"]
            assert sum(o.tenant == "open" for o in outage) >= 20
            # The fail-closed one was refused, clearly, for exactly the outage.
            closed = [o for o in outage if o.tenant == "closed"]
            assert closed
            assert {(o.status, o.code) for o in closed} == {(503, "quota_unavailable")}
            assert all(o.status == 200 for o in outcomes if o.phase == "before")
            assert all(
                o.status == 200 for o in outcomes if o.phase == "after" and o.tenant == "open"
            )
            # Quotas count in Redis again (a fresh, empty server: only what came after).
            response = await cluster.b.get(
                f"/api/projects/{tenants['closed'].project_id}/quota",
                headers=tenants["closed"].user_headers,
            )
            assert response.json()["usage"]["day"]["used"] >= 1
    finally:
        redis.kill()
