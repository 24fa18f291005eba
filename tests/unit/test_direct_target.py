"""A project's custom LLM is called alone: no selection, no other backend, network
errors retried on it, HTTP errors returned as they are. And an override key reaches
the adapter on every path."""

from __future__ import annotations

from collections import deque

import msgspec
import pytest

from app.routing.backends.base import Backend
from app.routing.breaker import CircuitBreaker
from app.routing.errors import NoHealthyBackendError, UpstreamError
from app.routing.registry import BackendState
from app.routing.types import BackendSpec, RawBody, RouteHints
from tests.support.routing_fakes import FakeBackend, RoutingRig, Script


def body() -> RawBody:
    return msgspec.json.decode(b'{"messages":[{"role":"user","content":"hi"}]}', type=RawBody)


@pytest.fixture
def rig() -> RoutingRig:
    rig = RoutingRig()
    rig.add("shared")  # serves "m" too: a custom call must never land here
    return rig


def custom(script: Script) -> tuple[BackendState, FakeBackend]:
    spec = BackendSpec(name="custom:mine", kind="external", url="http://x", models=("m",))
    adapter = FakeBackend(spec, script)
    backend: Backend = adapter
    return BackendState(adapter=backend, breaker=CircuitBreaker(threshold=3)), adapter


async def test_a_network_error_is_retried_on_the_same_target(rig: RoutingRig) -> None:
    state, adapter = custom(Script(outcomes=deque(["transport", "transport"])))
    outcome = await rig.service.chat("m", body(), RouteHints(), target=state)
    assert outcome.backend == "custom:mine"
    assert outcome.attempts == 3
    assert len(adapter.calls) == 3
    assert rig.backend("shared").calls == []


async def test_network_errors_past_the_budget_surface(rig: RoutingRig) -> None:
    state, adapter = custom(Script(outcomes=deque(["transport"] * 3)))
    with pytest.raises(UpstreamError) as info:
        await rig.service.chat("m", body(), RouteHints(), target=state)
    assert info.value.upstream_status is None
    assert len(adapter.calls) == 3
    assert rig.backend("shared").calls == []


@pytest.mark.parametrize("outcome", ["fail500", "fail429", "fail400"])
async def test_http_errors_are_not_retried(rig: RoutingRig, outcome: str) -> None:
    state, adapter = custom(Script(outcomes=deque([outcome])))
    with pytest.raises(UpstreamError):
        await rig.service.chat("m", body(), RouteHints(), target=state)
    assert len(adapter.calls) == 1
    assert rig.backend("shared").calls == []


async def test_a_stream_that_fails_to_open_is_retried_on_the_target_only(rig: RoutingRig) -> None:
    state, adapter = custom(Script(outcomes=deque(["transport", "drop_before_first"])))
    assert adapter.calls == []
    relay = await rig.service.open_chat_stream(
        "m", body(), RouteHints(), include_usage=True, target=state
    )
    chunks = [chunk async for chunk in relay]
    await relay.aclose()
    assert chunks
    assert len(adapter.calls) == 3  # refused, dropped before a byte, then served
    assert relay.backend == "custom:mine"
    assert rig.backend("shared").calls == []
    assert state.in_flight == 0


async def test_an_open_breaker_fails_fast(rig: RoutingRig) -> None:
    state, adapter = custom(Script(outcomes=deque(["fail500"] * 3)))
    for _ in range(3):
        with pytest.raises(UpstreamError):
            await rig.service.chat("m", body(), RouteHints(), target=state)
    with pytest.raises(NoHealthyBackendError):
        await rig.service.chat("m", body(), RouteHints(), target=state)
    assert len(adapter.calls) == 3


async def test_an_override_key_reaches_the_adapter_on_every_path(rig: RoutingRig) -> None:
    hints = RouteHints(api_key="byo-key")
    await rig.service.chat("m", body(), hints)
    await rig.service.embed("m", body(), hints)
    relay = await rig.service.open_chat_stream("m", body(), hints, include_usage=False)
    async for _ in relay:
        pass
    await relay.aclose()
    assert [call.api_key for call in rig.backend("shared").calls] == ["byo-key"] * 3
    assert "byo-key" not in repr(hints)
