"""Limits are exact across replicas, whichever replica a call lands on.

- A key's ``rpm`` is one window of the same atomic admission as the project quota:
  300 concurrent calls of one key spread over three replicas against its rpm of 100
  admit exactly 100, and the project's other key is not held back.
- A project's money budget is a reservation: 300 concurrent priced calls over three
  replicas against a budget for 100 admit exactly 100, the rest are 429
  ``budget_exceeded``, and the usage records' spend is the budget to the micro-unit.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from uuid import UUID

import httpx
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from tests.support.cluster import (
    ADMIN,
    Cluster,
    Tenant,
    eventually,
    register_backend,
    unique,
    wait_healthy_everywhere,
)
from tests.support.helpers import bearer

pytestmark = pytest.mark.cluster

RPM = 100
CALLS = 300
# The burst must fit in one minute bucket: started with at least this much of it left.
MINUTE_LEFT = 40.0


async def serving(cluster: Cluster, upstream: tuple[FakeOpenAI, str]) -> tuple[FakeOpenAI, str]:
    """The fake registered as a backend, healthy on every replica; its model."""
    fake, url = upstream
    name = unique("backend")
    await register_backend(cluster.a, name, url)
    await wait_healthy_everywhere(cluster, name)
    return fake, fake.control.models[0]


async def test_a_keys_rpm_admits_exactly_its_limit_over_three_replicas(
    cluster: Cluster, tenant: Tenant, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, model = await serving(cluster, upstream)
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


# Output-only price: the estimate (max_tokens at the output price) is then exactly
# what each call costs, so a budget for 100 calls admits 100 even at full concurrency.
OUTPUT_PRICE = "3.5"  # per million output tokens
OUTPUT_MICROS = 3_500_000
BUDGET_CALLS = 100


async def test_a_project_budget_admits_exactly_its_calls_over_three_replicas(
    cluster: Cluster, tenant: Tenant, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, model = await serving(cluster, upstream)
    priced = await cluster.a.post(
        "/api/admin/prices",
        json={"model": model, "input": "0", "output": OUTPUT_PRICE},
        headers=ADMIN,
    )
    assert priced.status_code == 201, priced.text
    output_tokens = fake.control.chunks  # the fake answers this many completion tokens
    # Micro-units, rounded half up as the price book does.
    call_cost = (output_tokens * OUTPUT_MICROS + 500_000) // 1_000_000
    budget_micros = BUDGET_CALLS * call_cost
    budget = f"{budget_micros // 1_000_000}.{budget_micros % 1_000_000:06d}"
    limited = await cluster.a.put(
        f"/api/admin/projects/{tenant.project_id}/quota",
        json={"budgetPerDay": budget},
        headers=ADMIN,
    )
    assert limited.status_code == 200, limited.text

    async def priced_everywhere() -> bool:
        # Every replica answers with the new budget before the burst.
        for client in cluster.http:
            got = await client.get(
                f"/api/projects/{tenant.project_id}/quota", headers=tenant.user_headers
            )
            if got.status_code != 200 or got.json()["limits"].get("budgetPerDay") is None:
                return False
        return True

    await eventually(priced_everywhere, within=10.0)
    start = asyncio.Event()

    async def call(index: int) -> httpx.Response:
        await start.wait()
        return await cluster.http[index % len(cluster.http)].post(
            "/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": f"budget {index}"}],
                "max_tokens": output_tokens,
            },
            headers=bearer(tenant.api_key),
        )

    tasks = [asyncio.create_task(call(i)) for i in range(CALLS)]
    start.set()
    responses = await asyncio.gather(*tasks)

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: BUDGET_CALLS, 429: CALLS - BUDGET_CALLS}, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "budget_exceeded", response.text
            assert int(response.headers["retry-after"]) >= 1

    async def all_metered() -> bool:
        rows = await cluster.fetch(
            "SELECT count(*) AS n, coalesce(sum(cost_micros), 0) AS spent FROM usage_records "
            "WHERE project_id = $1 AND status = 200",
            UUID(tenant.project_id),
        )
        return bool(rows[0]["n"] == BUDGET_CALLS)

    await eventually(all_metered, within=15.0)
    [spent] = await cluster.fetch(
        "SELECT sum(cost_micros) AS spent FROM usage_records WHERE project_id = $1",
        UUID(tenant.project_id),
    )
    assert spent["spent"] == budget_micros
