"""Custom-LLM backend states are built by the routing factories, once per spec."""

from __future__ import annotations

from app.lib.http import UpstreamHttp
from app.routing.backends.base import Backend
from app.routing.backends.factory import build_backend
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.breaker import CircuitBreaker
from app.routing.direct_targets import ASSUMED_UP, DirectTargets
from app.routing.types import BackendSpec
from tests.support.routing_fakes import FakeBackend, Script


def spec(url: str = "http://x", key: str = "k") -> BackendSpec:
    return BackendSpec(name="custom:a", kind="external", url=url, api_key=key, models=("m",))


def targets(built: list[BackendSpec], *, max_entries: int = 10) -> DirectTargets:
    def factory(spec: BackendSpec) -> Backend:
        built.append(spec)
        return FakeBackend(spec, Script())

    return DirectTargets(factory, lambda: CircuitBreaker(threshold=2), max_entries=max_entries)


def test_one_state_per_spec_rebuilt_when_the_spec_changes() -> None:
    built: list[BackendSpec] = []
    direct = targets(built)
    first = direct.state_for(("p", "a"), spec())
    assert direct.state_for(("p", "a"), spec()) is first
    assert first.health == ASSUMED_UP
    assert first.breaker.threshold == 2
    rotated = direct.state_for(("p", "a"), spec(key="k2"))
    assert rotated is not first
    assert rotated.spec.api_key == "k2"
    assert len(built) == 2
    assert len(direct) == 1


def test_the_least_recently_used_fall_off() -> None:
    built: list[BackendSpec] = []
    direct = targets(built, max_entries=2)
    a = direct.state_for("a", spec())
    direct.state_for("b", spec())
    assert direct.state_for("a", spec()) is a  # used again: "b" is now the oldest
    direct.state_for("c", spec())
    assert len(direct) == 2
    assert direct.state_for("a", spec()) is a
    assert len(built) == 3


async def test_the_registry_factory_builds_the_custom_adapter(http: UpstreamHttp) -> None:
    direct = DirectTargets(lambda s: build_backend(s, http), CircuitBreaker)
    assert isinstance(direct.state_for("a", spec()).adapter, OpenAICompatibleBackend)
