"""In-process fake adapters and a fake clock for unit-testing routing rules.

These replace a whole backend (the adapter interface), not the HTTP client: HTTP
behaviour is covered against real loopback servers in tests/routing and tests/api.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from app.lib.events.memory import MemoryEventBus
from app.lib.state.memory import MemoryStateStore
from app.routing.affinity import AffinityStore
from app.routing.aliases import AliasTable
from app.routing.backends.base import Backend, ChatStream
from app.routing.breaker import CircuitBreaker
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.registry import BackendRegistry, BackendState
from app.routing.router import Router
from app.routing.service import RoutingService
from app.routing.types import (
    BackendSpec,
    ChatResult,
    EmbeddingResult,
    Health,
    HealthStatus,
    ProbeResult,
    UpstreamCall,
    Usage,
)
from app.routing.vllm_metrics import VllmMetricsCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Script:
    """What a fake backend does next: a queue of outcomes, then ``default``."""

    outcomes: deque[str] = field(default_factory=deque)
    default: str = "ok"
    probe_healthy: bool = True
    probe_models: tuple[str, ...] = ()
    metrics: str | None = None
    """Prometheus text this backend publishes (None: it publishes none)."""
    metrics_error: Exception | None = None

    def next(self) -> str:
        return self.outcomes.popleft() if self.outcomes else self.default


def _fail(outcome: str) -> None:
    if outcome == "fail500":
        raise UpstreamError.from_status(500, b"boom")
    if outcome == "fail429":
        raise UpstreamError.from_status(429, b"slow down")
    if outcome == "fail400":
        raise UpstreamError.from_status(400, b"bad request")
    if outcome == "transport":
        raise UpstreamError.transport("connection refused")


class FakeStream(ChatStream):
    def __init__(self, name: str, outcome: str) -> None:
        self._name = name
        self._outcome = outcome
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._outcome == "drop_before_first":
            raise StreamInterruptedError("reset before first chunk")
        yield f'data: {{"from":"{self._name}"}}\n\n'.encode()
        if self._outcome == "drop_after_first":
            self.completion_text_chars = 8
            raise StreamInterruptedError("reset mid-stream")
        self.usage = Usage(prompt_tokens=3, completion_tokens=5)
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        self.closed = True


class FakeBackend(Backend):
    kind = "external"
    capabilities = frozenset({"chat", "embeddings"})

    def __init__(self, spec: BackendSpec, script: Script) -> None:
        super().__init__(spec)
        self.kind = spec.kind
        self.script = script
        self.calls: list[UpstreamCall] = []
        self.streams: list[FakeStream] = []
        self.probes = 0

    def metrics_source(self) -> Callable[[], Awaitable[str]] | None:
        if self.script.metrics is None:
            return None

        async def scrape() -> str:
            if self.script.metrics_error is not None:
                raise self.script.metrics_error
            assert self.script.metrics is not None
            return self.script.metrics

        return scrape

    async def probe(self) -> ProbeResult:
        self.probes += 1
        if self.script.probe_healthy:
            return ProbeResult(True, "ok", self.script.probe_models)
        return ProbeResult(False, "connection refused")

    async def chat(self, call: UpstreamCall) -> ChatResult:
        self.calls.append(call)
        _fail(self.script.next())
        body = msgspec.json.encode({"served_by": self.name, "model": call.model})
        return ChatResult(body, Usage(prompt_tokens=3, completion_tokens=5))

    async def chat_stream(self, call: UpstreamCall) -> ChatStream:
        self.calls.append(call)
        outcome = self.script.next()
        _fail(outcome)
        stream = FakeStream(self.name, outcome)
        self.streams.append(stream)
        return stream

    async def embed(self, call: UpstreamCall) -> EmbeddingResult:
        self.calls.append(call)
        _fail(self.script.next())
        return EmbeddingResult(b'{"data":[]}', None)


class RoutingRig:
    """A registry, router and service over fake backends, with a fake clock."""

    def __init__(
        self, state: MemoryStateStore | None = None, events: MemoryEventBus | None = None
    ) -> None:
        """``state`` and ``events`` shared by two rigs make them two replicas."""
        self.clock = FakeClock()
        self.scripts: dict[str, Script] = {}
        self.registry = BackendRegistry(
            factory=self._build,
            breaker_factory=lambda: CircuitBreaker(clock=self.clock),
        )
        self.aliases = AliasTable()
        self.state = MemoryStateStore() if state is None else state
        self.events = MemoryEventBus() if events is None else events
        self.affinity = AffinityStore(self.state)
        self.metrics = VllmMetricsCache(clock=self.clock)
        self.router = Router(
            self.registry, self.aliases, self.affinity, metrics=self.metrics, clock=self.clock
        )
        self.service = RoutingService(self.registry, self.router, clock=self.clock)

    def _build(self, spec: BackendSpec) -> Backend:
        return FakeBackend(spec, self.scripts.setdefault(spec.name, Script()))

    def add(
        self,
        name: str,
        models: tuple[str, ...] = ("m",),
        *,
        healthy: bool = True,
        kind: str = "external",
        tags: frozenset[str] = frozenset(),
        max_concurrency: int | None = None,
    ) -> BackendState:
        state, _ = self.registry.upsert(
            BackendSpec(
                name=name,
                kind=kind,
                url="http://x",
                models=models,
                tags=tags,
                max_concurrency=max_concurrency,
            )
        )
        if healthy:
            state.health = Health(HealthStatus.HEALTHY, "ok", 0.0)
        return state

    def backend(self, name: str) -> FakeBackend:
        state = self.registry.get(name)
        assert state is not None
        adapter = state.adapter
        assert isinstance(adapter, FakeBackend)
        return adapter

    def script(self, name: str) -> Script:
        return self.scripts.setdefault(name, Script())


def hold_in_flight(state: BackendState, count: int) -> None:
    """Make ``count`` requests of this replica be in flight on ``state`` (sent, not
    ended), as requests the tests do not otherwise run."""
    while state.in_flight < count:
        state.load.dispatched()
    while state.in_flight > count:
        state.load.finished()


def vllm_metrics(running: float, waiting: float = 0.0) -> str:
    """A vLLM ``/metrics`` page showing this load."""
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
    )
