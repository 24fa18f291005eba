"""The call pipeline around selection: retries, breaker verdicts, in-flight, streams."""

from __future__ import annotations

import contextlib
import gc

import msgspec
import pytest

from app.routing.breaker import BreakerState
from app.routing.errors import NoHealthyBackendError, StreamInterruptedError, UpstreamError
from app.routing.health import HEALTH_CHANNEL, HealthChecker
from app.routing.relay import RelayedStream
from app.routing.types import HealthStatus, RawBody, RouteHints
from tests.support.routing_fakes import RoutingRig, hold_in_flight
from tests.unit.test_breaker import state_of


def body() -> RawBody:
    return msgspec.json.decode(
        b'{"messages":[{"role":"user","content":"hello there"}]}', type=RawBody
    )


@pytest.fixture
def rig() -> RoutingRig:
    return RoutingRig()


async def drain(rig: RoutingRig) -> tuple[list[bytes], RelayedStream]:
    relay = await rig.service.open_chat_stream("m", body(), RouteHints(), include_usage=False)
    chunks: list[bytes] = []
    try:
        async for chunk in relay:
            chunks.append(chunk)
    finally:
        await relay.aclose()
    return chunks, relay


async def test_chat_reports_backend_and_usage(rig: RoutingRig) -> None:
    rig.add("a")
    outcome = await rig.service.chat("m", body(), RouteHints())
    assert outcome.backend == "a"
    assert outcome.attempts == 1
    assert outcome.usage.total_tokens == 8
    assert not outcome.usage.estimated
    assert rig.registry.get("a").in_flight == 0  # type: ignore[union-attr]


async def test_retryable_failure_moves_to_another_backend(rig: RoutingRig) -> None:
    rig.add("a")
    rig.add("b")
    rig.script("a").default = "fail500"
    rig.script("b").default = "fail500"
    rig.script("b").outcomes.append("ok")
    # Whichever is tried first, the call ends on the one that succeeds.
    rig.script("a").outcomes.append("fail500")
    outcome = await rig.service.chat("m", body(), RouteHints())
    assert outcome.backend == "b"
    assert outcome.attempts in (1, 2)


async def test_at_most_two_retries(rig: RoutingRig) -> None:
    for name in ("a", "b", "c", "d"):
        rig.add(name)
        rig.script(name).default = "transport"
    with pytest.raises(UpstreamError) as info:
        await rig.service.chat("m", body(), RouteHints())
    assert info.value.status_code == 502
    tried = [n for n in ("a", "b", "c", "d") if rig.backend(n).calls]
    assert len(tried) == 3


async def test_when_every_candidate_failed_the_upstream_error_is_reported(rig: RoutingRig) -> None:
    rig.add("a")
    rig.script("a").default = "fail500"
    with pytest.raises(UpstreamError) as info:
        await rig.service.chat("m", body(), RouteHints())
    assert info.value.message == "upstream 500: boom"


async def test_client_errors_are_not_retried_and_do_not_trip_the_breaker(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    rig.script("a").default = "fail400"
    rig.script("b").default = "fail400"
    for _ in range(5):
        with pytest.raises(UpstreamError) as info:
            await rig.service.chat("m", body(), RouteHints())
        assert info.value.upstream_status == 400
    assert state_of(a.breaker) is BreakerState.CLOSED
    assert len(rig.backend("a").calls) + len(rig.backend("b").calls) == 5


async def test_failures_open_the_breaker_then_half_open_trial_closes_it(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.script("a").outcomes.extend(["fail500"] * 3)
    for _ in range(3):
        with pytest.raises(UpstreamError):
            await rig.service.chat("m", body(), RouteHints())
    assert state_of(a.breaker) is BreakerState.OPEN
    with pytest.raises(NoHealthyBackendError):
        await rig.service.chat("m", body(), RouteHints())
    assert len(rig.backend("a").calls) == 3  # the open breaker kept the call away
    rig.clock.advance(30)
    outcome = await rig.service.chat("m", body(), RouteHints())
    assert outcome.backend == "a"
    assert state_of(a.breaker) is BreakerState.CLOSED


async def test_stream_relays_and_settles(rig: RoutingRig) -> None:
    a = rig.add("a")
    chunks, relay = await drain(rig)
    assert chunks[-1] == b"data: [DONE]\n\n"
    assert relay.backend == "a"
    assert relay.usage.total_tokens == 8
    assert relay.first_byte_at is not None
    assert a.in_flight == 0
    assert rig.backend("a").streams[0].closed


async def test_stream_failing_to_open_is_retried_elsewhere(rig: RoutingRig) -> None:
    rig.add("a")
    rig.add("b")
    rig.script("a").default = "fail500"
    rig.script("b").default = "fail500"
    rig.script("b").outcomes.append("ok")
    rig.script("a").outcomes.append("fail500")
    chunks, relay = await drain(rig)
    assert relay.backend == "b"
    assert b'"from":"b"' in chunks[0]


async def test_stream_dropping_before_first_byte_is_retried(rig: RoutingRig) -> None:
    a = rig.add("a")
    b = rig.add("b")
    # The first pick is deterministic (round-robin starts at the first name).
    rig.script("a").outcomes.append("drop_before_first")
    chunks, relay = await drain(rig)
    assert chunks[-1] == b"data: [DONE]\n\n"
    assert relay.attempts == 2
    assert a.in_flight == 0
    assert b.in_flight == 0
    assert relay.backend == "b"
    assert a.breaker.consecutive_failures == 1
    assert b.breaker.consecutive_failures == 0


async def test_stream_failing_after_first_byte_is_not_retried(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    rig.script("a").default = "drop_after_first"
    rig.script("b").default = "drop_after_first"
    relay = await rig.service.open_chat_stream("m", body(), RouteHints(), include_usage=False)
    got: list[bytes] = []

    async def consume() -> None:
        async for chunk in relay:
            got.append(chunk)

    with pytest.raises(StreamInterruptedError):
        await consume()
    await relay.aclose()
    assert len(got) == 1
    assert relay.failed
    assert relay.usage.estimated
    assert relay.usage.completion_tokens >= 1
    assert sum(len(rig.backend(n).calls) for n in ("a", "b")) == 1
    assert a.in_flight == 0


async def test_client_leaving_mid_stream_releases_everything(rig: RoutingRig) -> None:
    a = rig.add("a")
    relay = await rig.service.open_chat_stream("m", body(), RouteHints(), include_usage=False)
    assert a.in_flight == 1
    iterator = relay.__aiter__()
    await iterator.__anext__()
    await iterator.aclose()
    await relay.aclose()
    await relay.aclose()  # idempotent
    assert a.in_flight == 0
    assert rig.backend("a").streams[0].closed
    assert state_of(a.breaker) is BreakerState.CLOSED


async def test_usage_is_estimated_when_the_upstream_reports_none(rig: RoutingRig) -> None:
    rig.add("a")
    outcome = await rig.service.embed("m", body(), RouteHints())
    assert outcome.usage.estimated
    assert outcome.usage.prompt_tokens > 0


async def test_list_models_has_healthy_backends_and_routable_aliases(rig: RoutingRig) -> None:
    rig.add("a", models=("x", "y"))
    rig.add("b", models=("z",), healthy=False)
    rig.aliases.set("fast", "x")
    rig.aliases.set("dead", "z")
    listed = {m.id: m.owned_by for m in rig.service.list_models()}
    assert listed == {"x": "a", "y": "a", "fast": "alias"}


async def test_health_checker_probes_new_backends_and_publishes_changes(rig: RoutingRig) -> None:
    checker = HealthChecker(rig.registry, rig.events, interval=60)
    checker.watch()
    rig.script("a").probe_models = ("discovered",)
    async with rig.events.subscribe(HEALTH_CHANNEL) as events:
        state = rig.add("a", models=("static",), healthy=False)
        event = await anext(events)
        assert event["backend"] == "a"
        assert event["status"] == "healthy"
        assert event["previous"] == "unknown"
    assert state.health.status is HealthStatus.HEALTHY
    assert state.models == ("static", "discovered")
    rig.script("a").probe_healthy = False
    async with rig.events.subscribe(HEALTH_CHANNEL) as events:
        await checker.probe_all()
        event = await anext(events)
        assert event["status"] == "unhealthy"
        assert event["reason"] == "connection refused"
    # Discovered models survive an outage, so the model stays known (500, not 404).
    assert state.models == ("static", "discovered")
    await checker.close()


async def test_probe_result_for_a_replaced_backend_is_discarded(rig: RoutingRig) -> None:
    checker = HealthChecker(rig.registry, rig.events, interval=60)
    old = rig.add("a", healthy=False)
    rig.add("a", healthy=False)
    await checker.probe(old)
    current = rig.registry.get("a")
    assert current is not None
    assert current.health.status is HealthStatus.UNKNOWN


async def test_retries_never_return_to_a_backend_that_failed_this_request(
    rig: RoutingRig,
) -> None:
    for name in ("a", "b"):
        rig.add(name)
        rig.script(name).default = "transport"
    with pytest.raises(UpstreamError):
        await rig.service.chat("m", body(), RouteHints())
    assert [len(rig.backend(n).calls) for n in ("a", "b")] == [1, 1]


async def test_two_retries_reach_a_third_backend(rig: RoutingRig) -> None:
    for name in ("a", "b", "c"):
        rig.add(name)
    rig.script("a").default = "fail500"
    rig.script("b").default = "transport"
    # c is the busiest, so the order is a (first of the tie), b, then c.
    c = rig.registry.get("c")
    assert c is not None
    hold_in_flight(c, 1)
    outcome = await rig.service.chat("m", body(), RouteHints())
    assert outcome.backend == "c"
    assert outcome.attempts == 3


async def test_stream_drops_before_the_first_byte_are_retried_at_most_twice(
    rig: RoutingRig,
) -> None:
    for name in ("a", "b", "c", "d"):
        rig.add(name)
        rig.script(name).default = "drop_before_first"
    with pytest.raises(StreamInterruptedError):
        await drain(rig)
    tried = [n for n in ("a", "b", "c", "d") if rig.backend(n).calls]
    assert len(tried) == 3
    assert all(len(rig.backend(n).calls) == 1 for n in tried)


async def test_failed_calls_leave_no_reference_cycles(rig: RoutingRig) -> None:
    # A cycle per failed call (an exception kept in a local of a frame its own
    # traceback holds) hands dozens of objects to the cyclic collector each time, and
    # its pauses stall every stream in flight: failures must be freed by refcount.
    states = [rig.add(name) for name in ("a", "b")]
    for name in ("a", "b"):
        rig.script(name).default = "fail500"

    async def fail_twice() -> None:
        for state in states:
            state.breaker.record_success()
        with contextlib.suppress(UpstreamError):
            await rig.service.chat("m", body(), RouteHints())
        for state in states:
            state.breaker.record_success()
        with contextlib.suppress(UpstreamError):
            await drain(rig)

    await fail_twice()  # first calls create what lives on (caches, connections)
    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            await fail_twice()
        assert gc.collect() == 0
    finally:
        gc.enable()
