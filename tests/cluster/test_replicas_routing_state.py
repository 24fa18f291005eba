"""Routing state the replicas share: a breaker opened or a cooldown started on one is
honoured by the others, and health probing happens once per interval cluster-wide
(every replica applying the results), surviving the death of the replica probing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.cluster.test_replicas_pins import backends, conversation, create_profile, turn
from tests.support.cluster import (
    ADMIN,
    PROPAGATION_BOUND_SECONDS,
    PROPAGATION_TARGET_SECONDS,
    Cluster,
    Tenant,
    eventually,
    register_backend,
    runtime_token,
    unique,
    wait_healthy_everywhere,
)
from tests.support.settings import REDIS_URL

pytestmark = pytest.mark.cluster

HEALTH_INTERVAL = 0.5  # ARONA_HEALTH_INTERVAL_SECONDS in tests/support/cluster.py
DEADLINE_SECONDS = 10.0
"""How long a polled condition may take before the test fails: many times what it
takes (printed where it is a figure), so a slow shared machine does not fail the test;
a passing test does not wait for it."""
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


async def breaker_of(cluster: Cluster, index: int, name: str) -> dict[str, Any]:
    response = await cluster.http[index].get(f"/api/admin/backends/{name}", headers=ADMIN)
    assert response.status_code == 200, response.text
    breaker: dict[str, Any] = response.json()["breaker"]
    return breaker


async def failing_stream(client: openai.AsyncOpenAI, model: str) -> None:
    async def consume() -> None:
        stream = await client.chat.completions.create(model=model, messages=MESSAGES, stream=True)
        async for _ in stream:
            pass

    with pytest.raises(openai.APIError):
        await consume()


async def test_a_breaker_opened_on_a_is_honoured_by_b_and_c(
    cluster: Cluster, tenant: Tenant
) -> None:
    model = unique("m")
    async with backends(cluster, model, 1) as (fake,):
        # Streams cut before their first frame fail the call; the listing (the probe)
        # stays healthy, so only the breaker can stop the traffic.
        fake.control.drop_stream_after = 0
        a = cluster.sdk(0, tenant.api_key)
        for _ in range(3):  # the breaker threshold
            await failing_stream(a, model)
        assert (await breaker_of(cluster, 0, fake.name))["state"] == "open"

        async def opened_on(index: int) -> float:
            async def opened() -> bool:
                state: str = (await breaker_of(cluster, index, fake.name))["state"]
                return state == "open"

            return await eventually(opened, PROPAGATION_BOUND_SECONDS)

        # B and C polled side by side, each with the whole bound.
        on_b, on_c = await asyncio.gather(opened_on(1), opened_on(2))
        print(
            f"\nA's open breaker seen on B after {on_b:.3f}s, on C after {on_c:.3f}s "
            f"(target {PROPAGATION_TARGET_SECONDS:g}s)"
        )
        shown = await breaker_of(cluster, 1, fake.name)
        assert 0 < shown["open_seconds_left"] <= 30
        calls_before = fake.stats.requests - fake.stats.listings
        for index in (1, 2):
            with pytest.raises(openai.APIStatusError) as info:
                await cluster.sdk(index, tenant.api_key).chat.completions.create(
                    model=model, messages=MESSAGES
                )
            # The project's "every backend unavailable" answer, naming the reason.
            assert info.value.status_code == 500
            assert "circuit breaker open" in info.value.message
        # B and C refused without calling the upstream they never saw fail.
        assert fake.stats.requests - fake.stats.listings == calls_before


async def test_a_cooldown_started_on_a_steers_b_away(cluster: Cluster, tenant: Tenant) -> None:
    model = unique("m")
    async with backends(cluster, model, 2) as (bad, good):
        bad.control.drop_stream_after = 0
        a = cluster.sdk(0, tenant.api_key)
        # Round-robin reaches the bad backend within a few streams; each failure there
        # is retried on the good one, so the client sees success.
        for _ in range(6):
            stream = await a.chat.completions.create(model=model, messages=MESSAGES, stream=True)
            async for _ in stream:
                pass
            if bad.stats.dropped_streams:
                break
        assert bad.stats.dropped_streams == 1

        async def cooling_on_b() -> bool:
            left: float = (await breaker_of(cluster, 1, bad.name))["cooling_seconds_left"]
            return left > 0

        took = await eventually(cooling_on_b, PROPAGATION_BOUND_SECONDS)
        print(
            f"\nA's cooldown seen on B after {took:.3f}s (target {PROPAGATION_TARGET_SECONDS:g}s)"
        )
        assert (await breaker_of(cluster, 1, bad.name))["state"] == "closed"
        chats_before = bad.stats.chats
        b = cluster.sdk(1, tenant.api_key)
        for _ in range(6):
            await b.chat.completions.create(model=model, messages=MESSAGES)
        assert bad.stats.chats == chats_before
        assert good.stats.chats >= 6


async def failover_state(cluster: Cluster, index: int, profile_id: str) -> dict[str, Any]:
    response = await cluster.http[index].get("/api/admin/failover", headers=ADMIN)
    assert response.status_code == 200, response.text
    profiles: list[dict[str, Any]] = response.json()["profiles"]
    return next(p for p in profiles if p["profileId"] == profile_id)


async def test_a_profile_found_slow_on_a_is_redirected_on_b(
    cluster: Cluster, tenant: Tenant
) -> None:
    token = await runtime_token(cluster.a, tenant)
    slow_model, fast_model = unique("slow-model"), unique("fast-model")
    async with (
        backends(cluster, slow_model, 1) as (slow,),
        backends(cluster, fast_model, 1) as (fast,),
    ):
        slow.control.delay_seconds = 0.4  # a time to first token past the threshold
        fast_profile = await create_profile(cluster, fast_model)
        slow_profile = await create_profile(
            cluster, slow_model, slowThresholdMs=200, failoverChain=[fast_profile]
        )
        for _ in range(3):  # the failover's minimum samples, all served by A
            conv = await conversation(cluster.a, token, slow_profile)
            result = await turn(cluster.a, token, conv)
            assert result.status == 200, result.events
        assert (await failover_state(cluster, 0, slow_profile))["state"] == "redirecting"
        streams_on_slow = slow.stats.streams

        async def redirecting_on_b() -> bool:
            state = await failover_state(cluster, 1, slow_profile)
            return bool(state["state"] == "redirecting" and state["samples"] == 3)

        # Samples go out every 0.5 s: B holds A's evidence well within a second after.
        took = await eventually(redirecting_on_b, DEADLINE_SECONDS)
        print(f"A's latency samples reached B's verdict in {took:.2f}s")
        # B never served the slow profile, yet it sends new conversations elsewhere.
        conv = await conversation(cluster.b, token, slow_profile)
        result = await turn(cluster.b, token, conv)
        assert result.status == 200, result.events
        assert result.headers["x-arona-profile"] == fast_profile
        assert result.headers["x-arona-failover"] == f"latency; from={slow_profile}"
        assert result.headers["x-arona-backend"] == fast.name
        assert slow.stats.streams == streams_on_slow


async def round_owners(redis: Redis) -> dict[int, int]:
    """Probe round -> pid of the replica that claimed it (this cluster's keys only)."""
    owners: dict[int, int] = {}
    async for key in redis.scan_iter(match="test:cluster:*health:round:*"):
        value = await redis.get(key)
        if value is None:
            continue
        round_no = bytes(key).rsplit(b":", 1)[1]
        owner = value.decode() if isinstance(value, bytes) else str(value)
        owners[int(round_no)] = int(owner.split(":")[1])
    return owners


async def test_probing_is_done_once_per_interval_and_every_replica_sees_it(
    cluster: Cluster,
) -> None:
    fake = FakeOpenAI(unique("probed"), models=[unique("m")])
    async with serve_asgi(fake) as url:
        await register_backend(cluster.a, fake.name, url)
        await wait_healthy_everywhere(cluster, fake.name)
        await asyncio.sleep(HEALTH_INTERVAL)  # past the probes each replica made on loading
        before, started = fake.stats.listings, time.monotonic()
        await asyncio.sleep(10 * HEALTH_INTERVAL)
        probes = fake.stats.listings - before
        rounds = (time.monotonic() - started) / HEALTH_INTERVAL
        print(f"{probes} probes in {rounds:.1f} rounds with 3 replicas")
        # Once per round: three replicas probing on their own would make it ~3x.
        assert 0.5 * rounds <= probes <= 1.5 * rounds

        # A model the upstream starts listing reaches every replica's routing table.
        discovered = unique("new")
        fake.control.models = [*fake.control.models, discovered]

        async def advertised_everywhere() -> bool:
            for client in cluster.http:
                response = await client.get(f"/api/admin/backends/{fake.name}", headers=ADMIN)
                if discovered not in response.json()["advertised_models"]:
                    return False
            return True

        took = await eventually(advertised_everywhere, DEADLINE_SECONDS)
        print(f"a newly listed model reached every replica in {took:.2f}s")

        fake.control.fail_status = 503  # (a 404 listing only means "no listing": healthy)

        async def unhealthy_everywhere() -> bool:
            for client in cluster.http:
                response = await client.get(f"/api/admin/backends/{fake.name}", headers=ADMIN)
                if response.json()["health"]["status"] != "unhealthy":
                    return False
            return True

        took = await eventually(unhealthy_everywhere, DEADLINE_SECONDS)
        print(f"a failing listing made the backend unhealthy everywhere in {took:.2f}s")
        await cluster.a.delete(f"/api/admin/backends/{fake.name}", headers=ADMIN)


async def test_when_the_prober_dies_the_next_round_is_probed_by_another(
    cluster: Cluster,
) -> None:
    """Last in the module: it kills a replica."""
    fake = FakeOpenAI(unique("probed"), models=[unique("m")])
    pids = {r.process.pid: r for r in cluster.replicas}
    redis = Redis.from_url(REDIS_URL)
    try:
        async with serve_asgi(fake) as url:
            await register_backend(cluster.a, fake.name, url)
            await wait_healthy_everywhere(cluster, fake.name)
            owners: dict[int, int] = {}

            async def a_round_claimed() -> bool:
                owners.update(await round_owners(redis))
                return any(pid in pids for pid in owners.values())

            await eventually(a_round_claimed, DEADLINE_SECONDS)
            last = max(r for r, pid in owners.items() if pid in pids)
            victim = pids[owners[last]]
            victim.process.kill()
            victim.process.wait(timeout=10)
            killed_at, before = time.monotonic(), fake.stats.listings

            async def claimed_by_a_survivor() -> bool:
                owners.update(await round_owners(redis))
                return any(
                    r > last and pid in pids and pid != victim.process.pid
                    for r, pid in owners.items()
                )

            takeover = await eventually(claimed_by_a_survivor, DEADLINE_SECONDS)
            print(f"round after the kill claimed {takeover:.2f}s later")
            await asyncio.sleep(6 * HEALTH_INTERVAL)
            rounds = (time.monotonic() - killed_at) / HEALTH_INTERVAL
            probes = fake.stats.listings - before
            print(f"{probes} probes in {rounds:.1f} rounds after the kill")
            assert probes >= 0.5 * rounds
            assert probes <= 1.5 * rounds + 1
    finally:
        await redis.aclose()
