"""Routing video through ``RoutingService``: only video backends are chosen, retryable
failures move to another MiniMax backend, and chat never reaches a video backend.

Every backend is a real adapter against a real server on a loopback port (two fake
MiniMax servers and a fake OpenAI-compatible one), made healthy by real probes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import pytest

from app.fakes.minimax_upstream import FakeMinimax
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.events.memory import MemoryEventBus
from app.lib.http import UpstreamHttp
from app.lib.state.memory import MemoryStateStore
from app.routing.affinity import AffinityStore
from app.routing.aliases import AliasTable
from app.routing.backends.factory import build_backend
from app.routing.backends.minimax import MinimaxVideoBackend
from app.routing.breaker import CircuitBreaker
from app.routing.errors import (
    ModelNotFoundError,
    NoHealthyBackendError,
    NotAVideoModelError,
    UpstreamError,
)
from app.routing.health import HealthChecker
from app.routing.registry import BackendRegistry, BackendState
from app.routing.router import Router
from app.routing.service import RoutingService, VideoSubmission
from app.routing.types import BackendSpec, RawBody, RouteHints, VideoTask
from tests.support.upstreams import Served as ServedUpstream

KEY = "mm-routing-key"
HAILUO = "MiniMax-Hailuo-02"
SHARED = "shared-name"
"""Advertised by the chat backend and by a video backend alike."""
CHAT_MODEL = "gpt-4o-mini"


@dataclass
class Rig:
    registry: BackendRegistry
    router: Router
    service: RoutingService
    health: HealthChecker
    aliases: AliasTable

    async def add(self, name: str, kind: str, url: str, *models: str) -> BackendState:
        state, _ = self.registry.upsert(
            BackendSpec(name, kind, url, api_key=KEY, models=tuple(models))
        )
        await self.health.probe(state)
        return state

    def state(self, name: str) -> BackendState:
        state = self.registry.get(name)
        assert state is not None
        return state


@dataclass
class Served:
    fake: FakeMinimax
    url: str


@pytest.fixture(scope="module")
async def _video_servers() -> AsyncIterator[tuple[Served, Served]]:
    first = FakeMinimax("mm-a", models=(HAILUO, SHARED), api_key=KEY)
    second = FakeMinimax("mm-b", models=(HAILUO,), api_key=KEY)
    async with serve_asgi(first) as first_url, serve_asgi(second) as second_url:
        yield Served(first, first_url), Served(second, second_url)


@pytest.fixture(scope="module")
async def _chat_server() -> AsyncIterator[ServedUpstream[FakeOpenAI]]:
    fake = FakeOpenAI("chat", models=(), api_key=KEY)
    async with serve_asgi(fake) as url:
        yield ServedUpstream(fake, url)


@pytest.fixture
def mm_a(
    _video_servers: tuple[Served, Served],
) -> Served:
    _video_servers[0].fake.reset()
    return _video_servers[0]


@pytest.fixture
def mm_b(
    _video_servers: tuple[Served, Served],
) -> Served:
    _video_servers[1].fake.reset()
    return _video_servers[1]


@pytest.fixture
def chat(_chat_server: ServedUpstream[FakeOpenAI]) -> ServedUpstream[FakeOpenAI]:
    _chat_server.fake.reset()
    return _chat_server


@pytest.fixture
async def rig(
    http: UpstreamHttp,
    mm_a: Served,
    mm_b: Served,
    chat: ServedUpstream[FakeOpenAI],
) -> Rig:
    """``mm-a`` and ``mm-b`` serve HAILUO (``mm-a`` also SHARED); ``chat-a`` serves
    CHAT_MODEL and SHARED. All healthy after one real probe each."""
    registry = BackendRegistry(
        factory=lambda spec: build_backend(spec, http), breaker_factory=CircuitBreaker
    )
    aliases = AliasTable()
    router = Router(registry, aliases, AffinityStore(MemoryStateStore()))
    rig = Rig(
        registry,
        router,
        RoutingService(registry, router),
        HealthChecker(registry, MemoryEventBus()),
        aliases,
    )
    await rig.add("mm-a", "minimax-cloud", mm_a.url, HAILUO, SHARED)
    await rig.add("mm-b", "minimax-cloud", mm_b.url, HAILUO)
    await rig.add("chat-a", "external", chat.url, CHAT_MODEL, SHARED)
    for name in ("mm-a", "mm-b", "chat-a"):
        assert rig.state(name).health.healthy, rig.state(name).health
    return rig


def task(prompt: str = "a lighthouse at dusk") -> VideoTask:
    # The model here is a placeholder: routing puts the served name in.
    return VideoTask(model="ignored", prompt=prompt, duration_seconds=6, width=1280, height=720)


def chat_body(model: str) -> RawBody:
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return msgspec.json.decode(msgspec.json.encode(payload), type=RawBody)


def embed_body(model: str) -> RawBody:
    return msgspec.json.decode(msgspec.json.encode({"model": model, "input": "hi"}), type=RawBody)


def creates(*fakes: Served) -> int:
    return sum(len(f.fake.requests_for("/v1/video_generation")) for f in fakes)


# --------------------------------------------------------------------- video routing


async def test_submit_goes_to_a_video_backend_with_the_served_name(
    rig: Rig, mm_a: Served, mm_b: Served
) -> None:
    submissions = [await rig.service.submit_video(HAILUO, task(), RouteHints()) for _ in range(4)]
    assert {s.backend for s in submissions} == {"mm-a", "mm-b"}  # least loaded, round-robin
    for submission in submissions:
        fake = mm_a.fake if submission.backend == "mm-a" else mm_b.fake
        assert submission.model_served == HAILUO
        assert fake.tasks[submission.task_id].body["model"] == HAILUO
    assert rig.state("mm-a").in_flight == rig.state("mm-b").in_flight == 0


async def test_a_model_chat_backends_also_advertise_goes_only_to_video_backends(
    rig: Rig, mm_a: Served, chat: ServedUpstream[FakeOpenAI]
) -> None:
    for _ in range(4):
        submission = await rig.service.submit_video(SHARED, task(), RouteHints())
        assert submission == VideoSubmission("mm-a", SHARED, submission.task_id)
    assert creates(mm_a) == 4
    assert chat.fake.stats.requests == 1  # its probe, nothing else


async def test_an_alias_resolves_to_the_name_the_backend_advertises(rig: Rig, mm_b: Served) -> None:
    rig.aliases.set("hailuo", HAILUO)
    submission = await rig.service.submit_video("hailuo", task(), RouteHints(provider="mm-b"))
    assert (submission.backend, submission.model_served) == ("mm-b", HAILUO)
    assert mm_b.fake.tasks[submission.task_id].body["model"] == HAILUO


async def test_the_provider_hint_picks_the_backend(rig: Rig, mm_a: Served, mm_b: Served) -> None:
    for _ in range(3):
        submission = await rig.service.submit_video(HAILUO, task(), RouteHints(provider="mm-b"))
        assert submission.backend == "mm-b"
    assert (creates(mm_a), creates(mm_b)) == (0, 3)
    by_kind = await rig.service.submit_video(HAILUO, task(), RouteHints(provider="minimax-cloud"))
    assert by_kind.backend in ("mm-a", "mm-b")


async def test_a_retryable_failure_moves_to_another_video_backend(
    rig: Rig, mm_a: Served, mm_b: Served
) -> None:
    mm_a.fake.control.create_error = 1002  # rate limited
    # The first pick of a fresh router is the first by name: mm-a fails, mm-b serves.
    submission = await rig.service.submit_video(HAILUO, task(), RouteHints())
    assert submission.backend == "mm-b"
    assert submission.task_id in mm_b.fake.tasks
    assert mm_a.fake.stats.faults == 1
    a = rig.state("mm-a")
    assert a.breaker.consecutive_failures == 1
    assert rig.router.is_cooling(a)
    assert not rig.router.is_cooling(rig.state("mm-b"))
    assert a.in_flight == rig.state("mm-b").in_flight == 0


async def test_a_non_retryable_failure_is_not_retried(rig: Rig, mm_a: Served, mm_b: Served) -> None:
    mm_a.fake.control.create_error = 1026  # sensitive content: any backend would refuse
    with pytest.raises(UpstreamError) as caught:
        await rig.service.submit_video(HAILUO, task(), RouteHints())
    assert (caught.value.provider_code, caught.value.retryable) == (1026, False)
    assert creates(mm_b) == 0
    a = rig.state("mm-a")
    assert a.breaker.consecutive_failures == 0  # the upstream answered: no breaker failure
    assert not rig.router.is_cooling(a)


async def test_when_every_video_backend_fails_the_last_error_is_raised(
    rig: Rig, mm_a: Served, mm_b: Served
) -> None:
    mm_a.fake.control.create_error = 1002
    mm_b.fake.control.fail_status = 503
    with pytest.raises(UpstreamError) as caught:
        await rig.service.submit_video(HAILUO, task(), RouteHints())
    assert caught.value.upstream_status == 503
    assert (creates(mm_a), creates(mm_b)) == (1, 1)  # each tried once, then none left
    assert rig.state("mm-b").breaker.consecutive_failures == 1


async def test_an_unknown_model_is_a_404(rig: Rig) -> None:
    with pytest.raises(ModelNotFoundError) as caught:
        await rig.service.submit_video("no-such-video-model", task(), RouteHints())
    error = caught.value
    assert not isinstance(error, NotAVideoModelError)
    assert (error.status_code, error.code, error.param) == (404, "model_not_found", "model")


async def test_a_model_only_chat_backends_serve_is_not_a_video_model(
    rig: Rig, chat: ServedUpstream[FakeOpenAI]
) -> None:
    with pytest.raises(NotAVideoModelError) as caught:
        await rig.service.submit_video(CHAT_MODEL, task(), RouteHints())
    error = caught.value
    assert (error.status_code, error.code, error.param) == (400, "not_a_video_model", "model")
    assert error.message == (
        f"Model {CHAT_MODEL} is not a video model: its backends serve chat or embeddings"
    )
    assert error.body()["error"]["type"] == "invalid_request_error"
    assert isinstance(error, ModelNotFoundError)  # code catching "no video backend" sees it
    assert chat.fake.stats.chats == 0


async def test_video_backends_all_down_is_no_healthy_backend(
    rig: Rig, mm_a: Served, refused_url: str
) -> None:
    await rig.add("mm-down", "minimax-cloud", refused_url, "only-here")
    assert not rig.state("mm-down").health.healthy
    with pytest.raises(NoHealthyBackendError) as caught:
        await rig.service.submit_video("only-here", task(), RouteHints())
    assert "mm-down: connection refused" in caught.value.message
    # A backend whose key stopped working is probed unhealthy and passed over too.
    mm_a.fake.api_key = "rotated"
    try:
        await rig.health.probe(rig.state("mm-a"))
        with pytest.raises(NoHealthyBackendError) as refused:
            await rig.service.submit_video(SHARED, task(), RouteHints())
    finally:
        mm_a.fake.api_key = KEY
    assert "mm-a: authentication failed (1004)" in refused.value.message
    assert creates(mm_a) == 0


async def test_video_backend_returns_the_adapter_that_polls_its_tasks(
    rig: Rig, mm_b: Served
) -> None:
    submission = await rig.service.submit_video(HAILUO, task(), RouteHints(provider="mm-b"))
    adapter = rig.service.video_backend(submission.backend)
    assert isinstance(adapter, MinimaxVideoBackend)
    assert adapter is rig.state("mm-b").adapter
    poll = await adapter.poll_video(submission.task_id)
    assert poll.provider_status == "Preparing"
    assert mm_b.fake.tasks[submission.task_id].polls == 1
    assert rig.service.video_backend("chat-a") is None
    assert rig.service.video_backend("nobody") is None


# --------------------------------------------------------------- chat stays on chat


async def test_chat_never_lands_on_a_video_backend(
    rig: Rig, mm_a: Served, mm_b: Served, chat: ServedUpstream[FakeOpenAI]
) -> None:
    for _ in range(4):
        outcome = await rig.service.chat(SHARED, chat_body(SHARED), RouteHints())
        assert outcome.backend == "chat-a"
    relay = await rig.service.open_chat_stream(
        SHARED, chat_body(SHARED), RouteHints(), include_usage=False
    )
    try:
        assert relay.backend == "chat-a"
        assert [chunk async for chunk in relay]
    finally:
        await relay.aclose()
    embedded = await rig.service.embed(SHARED, embed_body(SHARED), RouteHints())
    assert embedded.backend == "chat-a"
    assert chat.fake.stats.chats == 4
    assert chat.fake.stats.streams == 1
    assert [s.state.name for s in rig.router.candidates(SHARED, "chat", RouteHints())] == ["chat-a"]
    assert [s.state.name for s in rig.router.candidates(SHARED, "video", RouteHints())] == ["mm-a"]
    # Nothing but probes reached the video backends.
    for fake in (mm_a.fake, mm_b.fake):
        assert {r.path.split("?")[0] for r in fake.requests} == {"/v1/query/video_generation"}


async def test_a_video_model_asked_for_chat_is_a_404_that_says_so(rig: Rig, mm_a: Served) -> None:
    with pytest.raises(ModelNotFoundError) as caught:
        await rig.service.chat(HAILUO, chat_body(HAILUO), RouteHints())
    assert caught.value.status_code == 404
    assert caught.value.message == (
        f"model '{HAILUO}' not found (a video model: use /v1/video/generations)"
    )
    with pytest.raises(ModelNotFoundError):
        await rig.service.chat(HAILUO, chat_body(HAILUO), RouteHints(provider="mm-a"))
    with pytest.raises(ModelNotFoundError):
        await rig.service.embed(HAILUO, embed_body(HAILUO), RouteHints())
    assert not rig.router.can_serve(HAILUO)
    assert creates(mm_a) == 0


async def test_video_models_are_listed_like_any_other(rig: Rig) -> None:
    listed = {m.id: m.owned_by for m in rig.service.list_models()}
    assert listed[HAILUO] in ("mm-a", "mm-b")
    assert listed[CHAT_MODEL] == "chat-a"
