"""A real ``arona serve`` against a tenant's hostile upstream: bounded reads, 502s, memory.

A project's custom LLM may point at a server its owner controls. Answers far past the
bounds must cost the replica no more than the bound while they are refused, and the
memory must come back afterwards: the replica's resident size after a burst of
oversize replies stays within a small margin of what it was before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.fakes.hostile_upstream import HostileUpstream
from app.fakes.serve import serve_asgi
from tests.support.cluster import Cluster, Tenant, new_tenant, running_cluster, unique
from tests.support.helpers import custom_llm_body

OVERSIZE = 100 * 1024 * 1024
"""What the issue measured: ~100 MB answers to 4 concurrent calls took a replica
from 154 MB to 739 MB, for good."""
CONCURRENT = 4
ROUNDS = 3
RSS_MARGIN = 32 * 1024 * 1024
"""Allowed growth of the resident size over the bursts (allocator slack, caches that
warm up on the first refused call): below what one call may buffer (32 MiB) and far
below what the bursts sent (1.2 GB)."""


@pytest.fixture(scope="module")
async def replica(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    # A breaker that never opens: every call of the burst must reach the upstream.
    no_breaker = {"ARONA_BREAKER_FAILURE_THRESHOLD": "1000"}
    async with running_cluster(
        tmp_path_factory.mktemp("bounds"), size=1, extra_env=no_breaker
    ) as started:
        yield started


@pytest.fixture(scope="module")
async def hostile() -> AsyncIterator[tuple[HostileUpstream, str]]:
    fake = HostileUpstream(unique("hostile"), models=("their-model",))
    async with serve_asgi(fake) as url:
        yield fake, url


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def custom_llm(replica: Cluster, tenant: Tenant, url: str) -> str:
    name = unique("own")
    response = await replica.a.post(
        f"/api/projects/{tenant.project_id}/custom-llms",
        json=custom_llm_body(name, url, "their-model", apiKey="sk-own-" + "k" * 20),
        headers=tenant.user_headers,
    )
    assert response.status_code == 201, response.text
    return f"custom:{name}"


async def refused_burst(client: openai.AsyncOpenAI, model: str) -> list[Any]:
    async def one() -> Any:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
        return caught.value

    errors: list[Any] = []
    for _ in range(ROUNDS):
        errors += await asyncio.gather(*(one() for _ in range(CONCURRENT)))
    return errors


@pytest.mark.cluster
async def test_oversize_replies_are_refused_and_the_memory_comes_back(
    replica: Cluster, hostile: tuple[HostileUpstream, str]
) -> None:
    fake, url = hostile
    tenant = await new_tenant(replica.a)
    model = await custom_llm(replica, tenant, url)
    client = replica.sdk(0, tenant.api_key)
    pid = replica.replicas[0].process.pid

    fake.control.mode = "well"
    for _ in range(5):
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "Hello there"
    await asyncio.sleep(1.0)
    before = rss_bytes(pid)
    fake.control.mode, fake.control.size = "oversize", OVERSIZE

    sent_before = fake.stats.bytes_sent
    errors = await refused_burst(client, model)
    for error in errors:
        assert error.status_code == 502
        body = error.body
        assert body["code"] == "bad_gateway", body
        assert "larger than the 33554432-byte limit" in body["message"]
    # Each answer was cut near the limit and its connection closed, not drained.
    assert fake.stats.bytes_sent - sent_before < CONCURRENT * ROUNDS * OVERSIZE // 2

    # A stream whose one line never ends is cut the same way: before its first chunk,
    # so before any header, as a 502.
    with pytest.raises(openai.APIStatusError, match="longer than the 1048576-byte limit") as cut:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert cut.value.status_code == 502

    await asyncio.sleep(1.0)
    after = rss_bytes(pid)
    print(f"\nRSS before {before / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB")
    assert after - before < RSS_MARGIN, (before, after)

    # The replica still serves the same upstream once it behaves.
    fake.control.mode = "well"
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "Hello there"
