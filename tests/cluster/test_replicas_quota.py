"""Quota admission is one atomic reservation across replicas: 300 concurrent calls
spread over three replicas against a limit of 100 admit exactly 100."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from tests.support.cluster import (
    ADMIN,
    Cluster,
    Tenant,
    register_backend,
    unique,
    wait_healthy_everywhere,
)
from tests.support.helpers import bearer

pytestmark = pytest.mark.cluster

LIMIT = 100
CALLS = 300


async def test_300_concurrent_calls_over_three_replicas_admit_exactly_100(
    cluster: Cluster, tenant: Tenant, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, url = upstream
    model = fake.control.models[0]
    name = unique("backend")
    await register_backend(cluster.a, name, url)
    await wait_healthy_everywhere(cluster, name)
    # The day window: a minute window could roll over in the middle of the burst.
    response = await cluster.a.put(
        f"/api/admin/projects/{tenant.project_id}/quota",
        json={"perMinute": None, "perDay": LIMIT, "perMonth": None},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    # Every replica admits under the new ceiling (not a cached "unlimited").
    for client in cluster.http:
        response = await client.get(
            f"/api/projects/{tenant.project_id}/quota", headers=tenant.user_headers
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["day"]["limit"] == LIMIT, response.text

    start = asyncio.Event()

    async def call(client: httpx.AsyncClient, index: int) -> httpx.Response:
        await start.wait()
        return await client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": f"call {index}"}]},
            headers=bearer(tenant.api_key),
        )

    tasks = [
        asyncio.create_task(call(cluster.http[i % len(cluster.http)], i)) for i in range(CALLS)
    ]
    start.set()
    responses = await asyncio.gather(*tasks)

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: LIMIT, 429: CALLS - LIMIT}, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "quota_exceeded", response.text
            assert int(response.headers["retry-after"]) > 0
    assert fake.stats.chats == LIMIT

    for client in cluster.http:
        response = await client.get(
            f"/api/projects/{tenant.project_id}/quota", headers=tenant.user_headers
        )
        assert response.json()["usage"]["day"]["used"] == LIMIT, response.text
        refused = await client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "one more"}]},
            headers=bearer(tenant.api_key),
        )
        assert refused.status_code == 429, refused.text
    await cluster.a.delete(f"/api/admin/backends/{name}", headers=ADMIN)
