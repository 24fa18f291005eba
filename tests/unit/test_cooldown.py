"""Cooldown after a retryable failure: passed over while others can serve, never a 500."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from app.routing.breaker import BreakerState
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.router import affinity_key
from app.routing.types import RawBody, RouteHints
from tests.support.routing_fakes import RoutingRig, hold_in_flight
from tests.unit.test_breaker import state_of


def body() -> RawBody:
    return msgspec.json.decode(b'{"messages":[{"role":"user","content":"hi"}]}', type=RawBody)


@pytest.fixture
def rig() -> RoutingRig:
    return RoutingRig()


async def chat(rig: RoutingRig, **hints: object) -> str:
    outcome = await rig.service.chat("m", body(), RouteHints(**hints))  # type: ignore[arg-type]
    return outcome.backend


async def test_a_failed_backend_is_passed_over_until_its_cooldown_ends(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    rig.script("a").outcomes.append("transport")
    assert await chat(rig) == "b"  # a failed first, the retry went to b
    assert {await chat(rig) for _ in range(6)} == {"b"}
    rig.clock.advance(29.9)
    assert {await chat(rig) for _ in range(2)} == {"b"}
    rig.clock.advance(0.1)
    assert Counter([await chat(rig) for _ in range(4)]) == {"a": 2, "b": 2}
    assert a.cooldown_until is None  # a answered: cleared
    assert len(rig.backend("a").calls) == 3


@pytest.mark.parametrize("outcome", ["fail500", "transport"])
async def test_a_single_backend_pool_keeps_serving_after_one_failure(
    rig: RoutingRig, outcome: str
) -> None:
    a = rig.add("a")
    rig.script("a").outcomes.append(outcome)
    with pytest.raises(UpstreamError):
        await chat(rig)
    assert rig.router.is_cooling(a)
    assert await chat(rig) == "a"
    assert not rig.router.is_cooling(a)  # the success cleared it
    assert a.cooldown_until is None


async def test_when_every_candidate_is_cooling_the_lowest_score_wins(rig: RoutingRig) -> None:
    a = rig.add("a")
    b = rig.add("b")
    rig.router.cool_down(a)
    rig.router.cool_down(b)
    hold_in_flight(a, 2)
    assert {await chat(rig) for _ in range(3)} == {"b"}
    assert not rig.router.is_cooling(b)
    hold_in_flight(a, 0)
    # b answered, so it is warm again and preferred over a, still cooling.
    assert {await chat(rig) for _ in range(4)} == {"b"}


async def test_cooling_backends_still_share_evenly_when_all_are_cooling(rig: RoutingRig) -> None:
    for name in ("a", "b"):
        rig.router.cool_down(rig.add(name))
    picks = [(await rig.router.select("m", "chat", RouteHints())).state.name for _ in range(10)]
    assert Counter(picks) == {"a": 5, "b": 5}


async def test_the_breaker_stays_the_hard_stop(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.script("a").outcomes.extend(["fail500"] * 3)
    for _ in range(3):
        with pytest.raises(UpstreamError):
            await chat(rig)  # cooling but alone: used every time
    assert state_of(a.breaker) is BreakerState.OPEN
    assert len(rig.backend("a").calls) == 3


async def test_client_errors_do_not_cool_a_backend(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    rig.script("a").outcomes.append("fail400")
    with pytest.raises(UpstreamError):
        await chat(rig)
    assert a.cooldown_until is None
    assert Counter([await chat(rig) for _ in range(4)]) == {"a": 2, "b": 2}


async def test_throttling_cools_a_backend(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    rig.script("a").outcomes.append("fail429")
    assert await chat(rig) == "b"
    assert rig.router.is_cooling(a)
    assert {await chat(rig) for _ in range(4)} == {"b"}


async def test_a_stream_cut_mid_flight_cools_its_backend(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    rig.script("a").outcomes.append("drop_after_first")
    relay = await rig.service.open_chat_stream("m", body(), RouteHints(), include_usage=False)
    with pytest.raises(StreamInterruptedError):
        async for _ in relay:
            pass
    await relay.aclose()
    assert relay.backend == "a"
    assert rig.router.is_cooling(a)
    assert {await chat(rig) for _ in range(3)} == {"b"}


async def test_a_client_leaving_mid_stream_does_not_cool(rig: RoutingRig) -> None:
    a = rig.add("a")
    relay = await rig.service.open_chat_stream("m", body(), RouteHints(), include_usage=False)
    iterator = relay.__aiter__()
    await iterator.__anext__()
    await iterator.aclose()
    await relay.aclose()
    assert a.cooldown_until is None


async def test_a_conversation_leaves_its_cooling_backend_and_is_rebound(rig: RoutingRig) -> None:
    rig.add("a")
    rig.add("b")
    await rig.affinity.bind("p", affinity_key("c1", "m"), "a")
    rig.script("a").outcomes.append("fail500")
    hints = {"conversation_id": "c1", "affinity_scope": "p"}
    assert await chat(rig, **hints) == "b"
    assert await rig.affinity.pinned("p", affinity_key("c1", "m")) == "b"
    rig.clock.advance(60)
    assert {await chat(rig, **hints) for _ in range(3)} == {"b"}


async def test_cooldown_length_is_configurable(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.router.cooldown_seconds = 5.0
    rig.router.cool_down(a)
    rig.clock.advance(4.9)
    assert rig.router.is_cooling(a)
    rig.clock.advance(0.1)
    assert not rig.router.is_cooling(a)
