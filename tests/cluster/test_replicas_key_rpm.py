"""A key's ``rpm`` is one window of the same atomic admission as the project quota:
300 concurrent calls of one key spread over three replicas against its rpm of 100
admit exactly 100, and the project's other key is not held back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from tests.support.cluster import Cluster, Tenant, register_backend, unique, wait_healthy_everywhere
from tests.support.helpers import bearer

pytestmark = pytest.mark.cluster

RPM = 100
CALLS = 300
# The burst must fit in one minute bucket: started with at least this much of it left.
MINUTE_LEFT = 40.0


async def test_a_keys_rpm_admits_exactly_its_limit_over_three_replicas(
    cluster: Cluster, tenant: Tenant, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, url = upstream
    model = fake.control.models[0]
    name = unique("backend")
    await register_backend(cluster.a, name, url)
    await wait_healthy_everywhere(cluster, name)
    response = await cluster.a.post(
        f"/api/projects/{tenant.project_id}/api-keys",
        json={"name": "limited", "rpm": RPM},
        headers=tenant.user_headers,
    )
    assert response.status_code == 201, response.text
    key = response.json()["key"]
    # Every replica holds the key with its limit (the Projects API spends no rpm).
    for client in cluster.http:
        known = await client.get(f"/api/projects/{tenant.project_id}", headers=bearer(key))
        assert known.status_code == 200, known.text

    left = 60.0 - time.time() % 60.0
    if left < MINUTE_LEFT:
        await asyncio.sleep(left + 0.5)
    start = asyncio.Event()

    async def call(client: httpx.AsyncClient, index: int) -> httpx.Response:
        await start.wait()
        return await client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": f"call {index}"}]},
            headers=bearer(key),
        )

    tasks = [
        asyncio.create_task(call(cluster.http[i % len(cluster.http)], i)) for i in range(CALLS)
    ]
    start.set()
    responses = await asyncio.gather(*tasks)

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: RPM, 429: CALLS - RPM}, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "rate_limit_exceeded", response.text
            assert 1 <= int(response.headers["retry-after"]) <= 60
    assert fake.stats.chats == RPM
    other = await cluster.b.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "other key"}]},
        headers=bearer(tenant.api_key),
    )
    assert other.status_code == 200, other.text
