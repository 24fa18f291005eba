"""Every selection rule, on fake backends with a fake clock."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from app.routing.errors import ModelNotFoundError, NoHealthyBackendError
from app.routing.names import canonical
from app.routing.router import affinity_key
from app.routing.types import (
    BackendSpec,
    Health,
    HealthStatus,
    ProbeResult,
    RouteHints,
    ScoreKind,
)
from tests.support.routing_fakes import RoutingRig, hold_in_flight, vllm_metrics


@pytest.fixture
def rig() -> RoutingRig:
    return RoutingRig()


async def select(rig: RoutingRig, model: str = "m", **hints: object) -> str:
    selection = await rig.router.select(model, "chat", RouteHints(**hints))  # type: ignore[arg-type]
    selection.state.breaker.record_success()
    return selection.state.name


def test_canonical_names() -> None:
    assert canonical("nomic-embed-text:latest") == "nomic-embed-text"
    assert canonical("qwen3:0.6b") == "qwen3:0.6b"
    assert canonical("plain") == "plain"


async def test_unknown_model_is_model_not_found(rig: RoutingRig) -> None:
    rig.add("a")
    with pytest.raises(ModelNotFoundError) as info:
        await select(rig, "nope")
    assert info.value.message == "model 'nope' not found"
    assert info.value.status_code == 404


async def test_known_model_with_only_unhealthy_backends_is_500(rig: RoutingRig) -> None:
    rig.add("a", healthy=False)
    with pytest.raises(NoHealthyBackendError) as info:
        await select(rig)
    assert info.value.status_code == 500
    assert "not probed yet" in info.value.message


async def test_fail_closed_until_probed(rig: RoutingRig) -> None:
    state = rig.add("a", healthy=False)
    assert state.health.status is HealthStatus.UNKNOWN
    with pytest.raises(NoHealthyBackendError):
        await select(rig)


async def test_latest_tag_rules(rig: RoutingRig) -> None:
    rig.add("ollama", models=("nomic-embed-text:latest", "qwen3:0.6b"))
    selection = await rig.router.select("nomic-embed-text", "chat", RouteHints())
    assert selection.served_model == "nomic-embed-text:latest"
    assert (
        await rig.router.select("qwen3:0.6b", "chat", RouteHints())
    ).served_model == "qwen3:0.6b"
    with pytest.raises(ModelNotFoundError):
        await rig.router.select("qwen3", "chat", RouteHints())
    with pytest.raises(ModelNotFoundError):
        await rig.router.select("qwen3:1.7b", "chat", RouteHints())
    with pytest.raises(ModelNotFoundError):
        await rig.router.select("nomic-embed-text:v1.5", "chat", RouteHints())


async def test_static_models_come_first_and_discovery_is_deduplicated(rig: RoutingRig) -> None:
    state = rig.add("a", models=("x", "y"))
    state.apply_probe(ProbeResult(True, "ok", ("y", "z", "x", "z")), state.health)
    assert state.models == ("x", "y", "z")


async def test_alias_resolves_before_routing(rig: RoutingRig) -> None:
    rig.add("a", models=("real-model",))
    rig.aliases.set("fast", "real-model")
    assert rig.router.resolve("fast") == "real-model"
    assert rig.router.resolve("real-model") == "real-model"


async def test_provider_hint_filters_by_name_or_kind_case_insensitively(rig: RoutingRig) -> None:
    rig.add("alpha")
    rig.add("beta", kind="ollama")
    assert {await select(rig, provider="ALPHA") for _ in range(4)} == {"alpha"}
    assert {await select(rig, provider="Ollama") for _ in range(4)} == {"beta"}
    with pytest.raises(ModelNotFoundError):
        await select(rig, provider="gamma")


async def test_provider_hint_takes_the_seed_kind_names(rig: RoutingRig) -> None:
    rig.add("alpha")
    rig.add("video", kind="minimax-cloud")
    rig.add("cep-box", kind="engine")
    for hint in ("cloud", "CLOUD", "Minimax", "minimax-cloud"):
        assert {await select(rig, provider=hint) for _ in range(4)} == {"video"}, hint
    for hint in ("cep", "CEP", "engine"):
        assert {await select(rig, provider=hint) for _ in range(4)} == {"cep-box"}, hint
    assert {await select(rig, provider="External") for _ in range(4)} == {"alpha"}
    # An alias names a kind, nothing else: no backend of another kind passes it.
    rig.registry.remove("video")
    with pytest.raises(ModelNotFoundError):
        await select(rig, provider="cloud")


async def test_capability_filter(rig: RoutingRig) -> None:
    rig.add("a")
    with pytest.raises(ModelNotFoundError):
        await rig.router.select("m", "video", RouteHints())


async def test_open_breaker_excludes_backend(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    for _ in range(3):
        a.breaker.record_failure()
    assert {await select(rig) for _ in range(6)} == {"b"}


async def test_all_breakers_open_is_500(rig: RoutingRig) -> None:
    a = rig.add("a")
    for _ in range(3):
        a.breaker.record_failure()
    with pytest.raises(NoHealthyBackendError) as info:
        await select(rig)
    assert "circuit breaker open" in info.value.message


async def test_half_open_gives_exactly_one_trial(rig: RoutingRig) -> None:
    a = rig.add("a")
    for _ in range(3):
        a.breaker.record_failure()
    rig.clock.advance(30)
    first = await rig.router.select("m", "chat", RouteHints())
    assert first.state is a
    with pytest.raises(NoHealthyBackendError):
        await rig.router.select("m", "chat", RouteHints())


async def test_least_loaded_wins(rig: RoutingRig) -> None:
    a = rig.add("a")
    rig.add("b")
    hold_in_flight(a, 2)
    assert {await select(rig) for _ in range(5)} == {"b"}


async def test_ties_go_round_robin_so_equal_backends_share_evenly(rig: RoutingRig) -> None:
    for name in ("a", "b", "c"):
        rig.add(name)
    counts = Counter([await select(rig) for _ in range(300)])
    assert counts == {"a": 100, "b": 100, "c": 100}


async def test_affinity_prefers_the_last_backend_then_rebinds_when_unhealthy(
    rig: RoutingRig,
) -> None:
    rig.add("a")
    rig.add("b")
    first = await select(rig, conversation_id="c1", affinity_scope="p1")
    # A little busier than the other: the conversation stays (its prefix cache).
    pinned_state = rig.registry.get(first)
    assert pinned_state is not None
    hold_in_flight(pinned_state, 1)
    assert {await select(rig, conversation_id="c1", affinity_scope="p1") for _ in range(5)} == {
        first
    }
    pinned_state.health = Health(HealthStatus.UNHEALTHY, "down", 1.0)
    other = await select(rig, conversation_id="c1", affinity_scope="p1")
    assert other != first
    pinned_state.health = Health(HealthStatus.HEALTHY, "ok", 2.0)
    hold_in_flight(pinned_state, 0)
    # Re-bound: the conversation stays on its new backend after the old one recovers.
    assert {await select(rig, conversation_id="c1", affinity_scope="p1") for _ in range(5)} == {
        other
    }


@pytest.mark.parametrize("kind", ["seed", "capacity"])
async def test_every_turn_is_scored_a_loaded_backend_is_left(
    rig: RoutingRig, kind: ScoreKind
) -> None:
    rig.add("a")
    rig.add("b")
    first = await select(rig, conversation_id="c1", affinity_scope="p1", score=kind)
    pinned_state = rig.registry.get(first)
    assert pinned_state is not None
    # Loaded past the margin: the next turn goes elsewhere and the conversation moves.
    hold_in_flight(pinned_state, 8)
    moved = await select(rig, conversation_id="c1", affinity_scope="p1", score=kind)
    assert moved != first
    hold_in_flight(pinned_state, 0)
    assert await select(rig, conversation_id="c1", affinity_scope="p1", score=kind) == moved


async def test_affinity_rebinds_when_the_backend_is_removed(rig: RoutingRig) -> None:
    rig.add("a")
    rig.add("b")
    first = await select(rig, conversation_id="c1", affinity_scope="p")
    rig.registry.remove(first)
    second = await select(rig, conversation_id="c1", affinity_scope="p")
    assert second != first
    assert await rig.affinity.pinned("p", affinity_key("c1", "m")) == second


async def test_pins_are_scoped_per_project(rig: RoutingRig) -> None:
    rig.add("a")
    rig.add("b")
    await rig.affinity.bind("p1", affinity_key("same-id", "m"), "a")
    await rig.affinity.bind("p2", affinity_key("same-id", "m"), "b")
    assert await select(rig, conversation_id="same-id", affinity_scope="p1") == "a"
    assert await select(rig, conversation_id="same-id", affinity_scope="p2") == "b"


async def test_pins_expire(rig: RoutingRig) -> None:
    rig.affinity.ttl = 0.05
    rig.add("a")
    await select(rig, conversation_id="c", affinity_scope="p")
    assert await rig.affinity.pinned("p", affinity_key("c", "m")) == "a"
    await asyncio.sleep(0.1)
    assert await rig.affinity.pinned("p", affinity_key("c", "m")) is None


async def test_replacing_a_backend_starts_it_fail_closed(rig: RoutingRig) -> None:
    rig.add("a")
    state, old = rig.registry.upsert(
        BackendSpec(name="a", kind="external", url="http://y", models=("m",))
    )
    assert old is not None
    assert state.health.status is HealthStatus.UNKNOWN
    with pytest.raises(NoHealthyBackendError):
        await select(rig)


async def test_published_load_decides_and_follows_its_changes(rig: RoutingRig) -> None:
    rig.add("a", kind="vllm")
    rig.add("b", kind="vllm")
    rig.router.score_kind = "seed"
    rig.script("a").metrics = vllm_metrics(running=2, waiting=1)  # score 12
    rig.script("b").metrics = vllm_metrics(running=5)  # score 5
    b = rig.registry.get("b")
    assert b is not None
    assert {await select(rig) for _ in range(4)} == {"b"}
    assert b.in_flight == 0  # each call above ended: the estimate is the reading again
    rig.script("b").metrics = vllm_metrics(running=5, waiting=2)  # score 25
    rig.clock.advance(0.3)  # busy backends are read again after a quarter of a second
    await select(rig)
    await asyncio.sleep(0.01)
    assert {await select(rig) for _ in range(4)} == {"a"}


async def test_unavailable_metrics_are_penalised_but_still_a_last_resort(
    rig: RoutingRig,
) -> None:
    rig.add("a", kind="vllm")
    rig.add("b", kind="vllm")
    rig.script("a").metrics = vllm_metrics(running=400, waiting=40)
    rig.script("b").metrics = ""
    rig.script("b").metrics_error = ConnectionRefusedError("connection refused")
    assert {await select(rig) for _ in range(4)} == {"a"}
    rig.registry.remove("a")
    assert await select(rig) == "b"
    assert rig.metrics.last_error("b") == "connection refused"


async def test_equal_published_loads_share_evenly(rig: RoutingRig) -> None:
    for name in ("a", "b"):
        rig.add(name, kind="vllm")
        rig.script(name).metrics = vllm_metrics(running=3)
    assert Counter([await select(rig) for _ in range(100)]) == {"a": 50, "b": 50}


async def test_calls_sent_since_the_reading_add_to_the_published_load(rig: RoutingRig) -> None:
    a = rig.add("a", kind="vllm")
    rig.add("b", kind="vllm")
    rig.script("a").metrics = vllm_metrics(running=1)
    rig.script("b").metrics = vllm_metrics(running=3)
    assert await select(rig) == "a"  # both read now
    hold_in_flight(a, 5)  # sent since: the reading does not show them yet
    assert await select(rig) == "b"


async def test_required_tags_pick_only_backends_carrying_all_of_them(rig: RoutingRig) -> None:
    rig.add("plain")
    rig.add("smart", tags=frozenset({"smart"}))
    rig.add("smart-fast", tags=frozenset({"smart", "fast"}))
    smart = {await select(rig, tags=frozenset({"smart"})) for _ in range(6)}
    assert smart == {"smart", "smart-fast"}
    both = {await select(rig, tags=frozenset({"smart", "fast"})) for _ in range(4)}
    assert both == {"smart-fast"}
    # No required tags: any backend.
    assert {await select(rig) for _ in range(6)} == {"plain", "smart", "smart-fast"}


async def test_tags_no_backend_carries_are_model_not_found_naming_them(rig: RoutingRig) -> None:
    rig.add("a", tags=frozenset({"fast"}))
    with pytest.raises(ModelNotFoundError) as info:
        await select(rig, tags=frozenset({"smart", "gpu"}))
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.message == "model 'm' not found (requires backend tags: gpu, smart)"
    with pytest.raises(ModelNotFoundError) as unknown:
        await select(rig, "nope", tags=frozenset({"smart"}))
    assert unknown.value.message == "model 'nope' not found"


async def test_tagged_backends_that_are_down_are_500_not_404(rig: RoutingRig) -> None:
    rig.add("a", tags=frozenset({"smart"}), healthy=False)
    rig.add("b")
    with pytest.raises(NoHealthyBackendError):
        await select(rig, tags=frozenset({"smart"}))


async def test_removed_backend_metrics_are_forgotten(rig: RoutingRig) -> None:
    rig.add("a", kind="vllm")
    rig.script("a").metrics = ""
    rig.script("a").metrics_error = ConnectionRefusedError("connection refused")
    await select(rig)
    assert rig.metrics.last_error("a") == "connection refused"
    rig.registry.remove("a")
    assert rig.metrics.last_error("a") == ""


async def test_replaced_backend_is_scraped_afresh(rig: RoutingRig) -> None:
    rig.add("a", kind="vllm")
    rig.add("b", kind="vllm")
    rig.script("a").metrics = vllm_metrics(running=1)
    rig.script("b").metrics = vllm_metrics(running=5)
    assert await select(rig) == "a"
    rig.script("a").metrics = vllm_metrics(running=50)
    rig.add("a", kind="vllm")  # the new spec may point elsewhere: the old reading is void
    assert await select(rig) == "b"


def test_registry_announces_removed_and_replaced_states(rig: RoutingRig) -> None:
    removed: list[object] = []
    rig.registry.on_removed(removed.append)
    first = rig.add("a")
    assert removed == []
    rig.add("a")
    assert removed == [first]
    current = rig.registry.get("a")
    rig.registry.remove("a")
    rig.registry.remove("a")
    assert removed == [first, current]


async def test_a_pin_is_per_model_and_tag_set(rig: RoutingRig) -> None:
    # A turn moved to another profile (same model, other tags) must not inherit the
    # backend the slow profile was pinned to.
    rig.add("a", tags=frozenset({"smart"}))
    rig.add("b", tags=frozenset({"smart"}))
    rig.add("c")
    await rig.affinity.bind("p", affinity_key("c1", "m", frozenset({"smart"})), "b")
    assert (
        await select(rig, conversation_id="c1", affinity_scope="p", tags=frozenset({"smart"}))
        == "b"
    )
    other = await select(rig, conversation_id="c1", affinity_scope="p")
    assert await rig.affinity.pinned("p", affinity_key("c1", "m")) == other
    assert await rig.affinity.pinned("p", affinity_key("c1", "m", frozenset({"smart"}))) == "b"
