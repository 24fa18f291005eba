"""Upstream faults under load: a backend that hangs, resets its connections or answers
slowly occupies only the calls routed to it. Calls to a healthy backend keep their
latency, the faulty one's calls end in the API's error shape within the read timeout,
and its circuit breaker then refuses further calls without touching it.

One replica (isolation is a matter of one process: one upstream pool, one event loop)
serves model H on a healthy fake, model G on another healthy fake and model F on a
faulty upstream. H latency is measured alone, while workers call G (the no-fault run)
and while the same workers call F, in interleaved rounds (A B C C B A ...) so that the
noise of a shared machine hits every condition alike. The issue's bound is
p50(H beside F) <= 2 x p50(H beside G), both from the same run: the ratio is printed
against it, and a generous 3x is asserted (so a noisy machine does not fail the test;
a fault starving H costs it seconds, not a fraction more). The no-fault run carries
the same extra calls as the faulty one because a refused call costs the replica about
what a relayed one does: against H alone the ratio measures the extra calls, not the
fault (it is printed too). Run with ``-s`` to see the figures; they are discussed in
docs/performance.md ("Upstream fault isolation").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.cluster import (
    ADMIN,
    Cluster,
    Tenant,
    eventually,
    register_backend,
    running_cluster,
    unique,
    wait_healthy_everywhere,
)
from tests.support.fault_upstreams import (
    Fault,
    Latencies,
    Outcome,
    faulty_call,
    faulty_upstream,
    gated_upstream,
    hammering,
    healthy_load,
    interleave,
    lowest_while,
    p50,
)

pytestmark = pytest.mark.cluster

READ_TIMEOUT_SECONDS = 5.0
"""The replica's upstream read timeout: how long a hung upstream holds a call. Many
times one H measurement (a few tenths of a second; about a second at a load average
of 10), so the first wave's measurement fits inside the first hold on a busy machine
too."""
BREAKER_THRESHOLD = 3
CLUSTER_ENV = {
    "ARONA_UPSTREAM_READ_TIMEOUT_SECONDS": str(READ_TIMEOUT_SECONDS),
    "ARONA_UPSTREAM_CONNECT_TIMEOUT_SECONDS": "1.0",
    "ARONA_BREAKER_FAILURE_THRESHOLD": str(BREAKER_THRESHOLD),
    # Open for the whole module: no half-open trial lets an F call through mid-test.
    "ARONA_BREAKER_OPEN_SECONDS": "600",
}
PAST_TIMEOUT_SECONDS = 2.5 * READ_TIMEOUT_SECONDS
"""The "slow" fault's delay: past the read timeout (and the 2 s probe timeout)."""

WORKERS = 8
"""Concurrent workers per load, H and F alike."""
H_PAUSE_SECONDS = 0.04
F_PAUSE_SECONDS = 0.1
"""Each worker's pause between two calls: neither load saturates the replica (a call
refused by a breaker costs the replica about what a relayed one does), so what is
measured is isolation, not queueing behind extra work."""
BLOCK = 24
"""H calls per measurement in the interleaved rounds (3 a worker)."""
FIRST_WAVE_CALLS = 48
"""H calls measured during the first wave of F calls (held by a hanging upstream)."""
ROUNDS = 6
ALONE = "alone"
NO_FAULT = "beside G"
"""H measured while workers call G, a healthy backend: the no-fault run."""
FAULT = "beside F"
"""H measured while the same workers call F, the faulty backend."""
RATIO_TARGET = 2.0
"""The issue's bound on p50(H beside F) / p50(H beside G): printed against."""
RATIO_BOUND = 3.0
"""The ratio asserted: generous for a shared machine (measured 0.5-1.1 on it, see
docs/performance.md), yet far below what H queued behind held F calls would show."""
ERROR_BOUND_SECONDS = 2.5 * READ_TIMEOUT_SECONDS
"""Every F call ends within this; with the default 120 s read timeout it would not."""
FAIL_FAST_CALLS = 6
FAIL_FAST_BOUND_SECONDS = 0.5 * READ_TIMEOUT_SECONDS
"""Each call refused by the open breaker ends within this (milliseconds, printed); one
that reached the hung upstream would be held for the whole read timeout."""


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """One replica (named ``cluster`` so the package's log dump on failure finds it)."""
    async with running_cluster(
        tmp_path_factory.mktemp("faults"), size=1, extra_env=CLUSTER_ENV
    ) as started:
        yield started


@dataclass(frozen=True)
class Healthy:
    """Two healthy backends: H (measured) and G (the no-fault twin of F's load)."""

    model_h: str
    reply_h: str
    model_g: str


@pytest.fixture(scope="module")
async def healthy(cluster: Cluster) -> AsyncIterator[Healthy]:
    fakes = [FakeOpenAI(unique(tag), models=[unique(f"model-{tag}")]) for tag in ("h", "g")]
    async with contextlib.AsyncExitStack() as stack:
        for fake in fakes:
            fake.control.record_requests = False
            url = await stack.enter_async_context(serve_asgi(fake))
            await register_backend(cluster.a, fake.name, url)
            await wait_healthy_everywhere(cluster, fake.name)
        h, g = fakes
        yield Healthy(h.control.models[0], h.reply_text(), g.control.models[0])


class Bench:
    """The loads of one test: H calls measured, F (or G) calls kept up around them."""

    def __init__(self, cluster: Cluster, tenant: Tenant, healthy: Healthy) -> None:
        self.healthy = healthy
        # A client per load, so H calls never share a client-side pool with the others.
        self.h_client = self._client(cluster, tenant)
        self.f_client = self._client(cluster, tenant)
        self.f_outcomes: list[Outcome] = []
        self.g_outcomes: list[Outcome] = []

    @staticmethod
    def _client(cluster: Cluster, tenant: Tenant) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{cluster.replicas[0].url}/v1",
            api_key=tenant.api_key,
            max_retries=0,
            timeout=30.0,
        )

    async def alone(self, calls: int = BLOCK) -> list[float]:
        """One measurement of H calls."""
        return await healthy_load(
            self.h_client,
            self.healthy.model_h,
            self.healthy.reply_h,
            requests=calls,
            workers=WORKERS,
            pause=H_PAUSE_SECONDS,
        )

    async def beside(self, model: str) -> list[float]:
        """One measurement of H calls while workers call ``model`` (F or G)."""
        async with hammering(self.f_client, model, workers=WORKERS, pause=F_PAUSE_SECONDS) as load:
            latencies = await self.alone()
        healthy = model == self.healthy.model_g
        (self.g_outcomes if healthy else self.f_outcomes).extend(load.outcomes)
        return latencies

    async def aclose(self) -> None:
        await self.h_client.close()
        await self.f_client.close()


@pytest.fixture
async def bench(cluster: Cluster, tenant: Tenant, healthy: Healthy) -> AsyncIterator[Bench]:
    started = Bench(cluster, tenant, healthy)
    await started.alone()  # warm-up: connections, caches, the replica's code paths
    await started.beside(healthy.model_g)
    started.g_outcomes.clear()
    yield started
    await started.aclose()


@pytest.fixture
async def backends(cluster: Cluster) -> AsyncIterator[list[str]]:
    """Names to register F backends under; they are removed at the end."""
    names: list[str] = []
    yield names
    for name in names:
        await cluster.a.delete(f"/api/admin/backends/{name}", headers=ADMIN)


async def add_faulty(cluster: Cluster, backends: list[str], url: str) -> str:
    name = unique("faulty")
    await register_backend(cluster.a, name, url)
    backends.append(name)
    await wait_healthy_everywhere(cluster, name)
    return name


async def breaker(cluster: Cluster, name: str) -> dict[str, Any]:
    response = await cluster.a.get(f"/api/admin/backends/{name}", headers=ADMIN)
    assert response.status_code == 200, response.text
    state: dict[str, Any] = response.json()["breaker"]
    return state


async def holding(held: Callable[[], int], calls: int) -> None:
    async def holds() -> bool:
        return held() >= calls

    await eventually(holds, within=10.0)


def describe(outcomes: list[Outcome]) -> str:
    counts: dict[tuple[int | None, str | None], int] = {}
    for outcome in outcomes:
        key = (outcome.status, outcome.code)
        counts[key] = counts.get(key, 0) + 1
    kinds = ", ".join(f"{status} {code or ''}: {n}" for (status, code), n in sorted(counts.items()))
    return f"{kinds}; slowest {max(o.seconds for o in outcomes):.2f} s"


@pytest.mark.parametrize("fault", ["hang", "reset", "slow"])
async def test_a_failing_upstream_is_cut_off_without_slowing_other_models(
    cluster: Cluster, bench: Bench, backends: list[str], fault: Fault
) -> None:
    model_f, model_g = unique("model-f"), bench.healthy.model_g
    async with faulty_upstream(fault, unique("f"), model_f, PAST_TIMEOUT_SECONDS) as faulty:
        name_f = await add_faulty(cluster, backends, faulty.url)
        latencies = Latencies()
        latencies.add(ALONE, await bench.alone())
        latencies.add(NO_FAULT, await bench.beside(model_g))

        # The first wave: F calls held until the read timeout (hang, slow) or reset at
        # once; the breaker opens once three have failed. The fault begins only now: a
        # hung or slow upstream fails its next health probe too (2 s into a round), and
        # F calls sent after that would be refused as unhealthy instead of held.
        faulty.begin()
        async with hammering(
            bench.f_client, model_f, workers=WORKERS, pause=F_PAUSE_SECONDS
        ) as load:
            if fault != "reset":
                await holding(faulty.held, WORKERS)
            measured = asyncio.ensure_future(bench.alone(FIRST_WAVE_CALLS))
            held = await lowest_while(faulty.held, measured)
            first_wave = measured.result()
            answered_meanwhile = len(load.outcomes)

            async def breaker_open() -> bool:
                return bool((await breaker(cluster, name_f))["state"] == "open")

            await eventually(breaker_open, within=READ_TIMEOUT_SECONDS + 10.0)
        bench.f_outcomes += load.outcomes
        latencies.add(FAULT, first_wave)

        # Then F calls refused by the breaker, interleaved with the other conditions.
        async def beside_g() -> list[float]:
            return await bench.beside(model_g)

        async def beside_f() -> list[float]:
            return await bench.beside(model_f)

        await interleave(
            latencies, {ALONE: bench.alone, NO_FAULT: beside_g, FAULT: beside_f}, ROUNDS
        )
        print(
            f"\n[{fault}] H p50: {latencies.summary()}; with the fault / without: "
            f"x{latencies.ratio(FAULT, NO_FAULT):.2f} (target <= x{RATIO_TARGET:g}) "
            f"(/ alone: x{latencies.ratio(FAULT, ALONE):.2f}); first wave "
            f"{p50(first_wave) * 1000:.1f} ms ({len(first_wave)} calls, the "
            f"upstream holding >= {held} F calls throughout); F calls: "
            f"{describe(bench.f_outcomes)}"
        )
        assert latencies.ratio(FAULT, NO_FAULT) <= RATIO_BOUND
        assert {o.status for o in bench.g_outcomes} == {200}
        if fault != "reset":
            # The first wave's measurement ran while the upstream held F calls open.
            assert answered_meanwhile == 0
            assert held >= WORKERS

        # Every F call got an answer in the error shape within a bounded time: 502 for
        # the upstream's own failure, then 500 once its breaker keeps calls away.
        for outcome in bench.f_outcomes:
            assert (outcome.status, outcome.code) in {
                (502, "bad_gateway"),
                (500, "backend_unavailable"),
            }, outcome
            assert outcome.seconds < ERROR_BOUND_SECONDS, outcome
        upstream_failures = [o for o in bench.f_outcomes if o.status == 502]
        assert len(upstream_failures) >= BREAKER_THRESHOLD
        reason = (
            "the upstream reset the connection"
            if fault == "reset"
            else f"the upstream did not answer within {READ_TIMEOUT_SECONDS:g}s"
        )
        assert all(reason in o.message for o in upstream_failures), upstream_failures

        # Later F calls fail fast: refused by the replica, the upstream never sees them.
        assert (await breaker(cluster, name_f))["state"] == "open"
        reached = faulty.reached()
        refused = [
            await faulty_call(bench.f_client, model_f, stream=index % 2 == 1)
            for index in range(FAIL_FAST_CALLS)
        ]
        print(
            f"[{fault}] refused by the open breaker: slowest of {FAIL_FAST_CALLS} calls "
            f"{max(o.seconds for o in refused) * 1000:.1f} ms"
        )
        for outcome in refused:
            assert (outcome.status, outcome.code) == (500, "backend_unavailable"), outcome
            assert outcome.seconds < FAIL_FAST_BOUND_SECONDS, outcome
        assert faulty.reached() == reached


async def test_a_slow_upstream_holds_only_its_own_calls(
    cluster: Cluster, bench: Bench, backends: list[str]
) -> None:
    """An upstream that answers slowly but within the timeout: each round, its calls are
    held until H has been measured (however long that takes, well within the read
    timeout), then answered. They are never counted as failures, and H calls do not
    wait behind them."""
    model_f = unique("model-f")
    async with gated_upstream(unique("f"), model_f) as (upstream, url):
        name_f = await add_faulty(cluster, backends, url)
        helds: list[int] = []

        def held() -> int:
            return upstream.waiting

        async def while_held() -> list[float]:
            # One wave of F calls, all held by the upstream while H is measured (each
            # worker's pause outlasts the block: one F call each), then answered.
            upstream.hold()
            async with hammering(
                bench.f_client, model_f, workers=WORKERS, pause=READ_TIMEOUT_SECONDS
            ) as load:
                try:
                    await holding(held, WORKERS)
                    measured = asyncio.ensure_future(bench.alone())
                    helds.append(await lowest_while(held, measured))
                    answered_meanwhile = len(load.outcomes)
                finally:
                    upstream.let_through()
            assert answered_meanwhile == 0
            bench.f_outcomes.extend(load.outcomes)
            return measured.result()

        latencies = Latencies()
        await interleave(latencies, {ALONE: bench.alone, FAULT: while_held}, ROUNDS)
        print(
            f"\n[slow within the timeout] H p50: {latencies.summary()}: "
            f"x{latencies.ratio(FAULT, ALONE):.2f} (target <= x{RATIO_TARGET:g}); the "
            f"upstream held >= {min(helds)} F calls throughout each measurement; F calls: "
            f"{describe(bench.f_outcomes)}"
        )
        assert latencies.ratio(FAULT, ALONE) <= RATIO_BOUND
        assert min(helds) >= WORKERS
        assert {(o.status, o.code) for o in bench.f_outcomes} == {(200, None)}
        assert all(o.seconds < ERROR_BOUND_SECONDS for o in bench.f_outcomes)
        state = await breaker(cluster, name_f)
        assert (state["state"], state["consecutive_failures"]) == ("closed", 0)
