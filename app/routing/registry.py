"""The in-process table of registered backends and their live state.

The domain layer feeds it (from the database at start-up and on change events); the
router reads it. Nothing here touches the database.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.routing.backends.base import Backend
from app.routing.breaker import BreakerState, CircuitBreaker
from app.routing.load import BackendLoad
from app.routing.names import canonical
from app.routing.types import NOT_PROBED, BackendSpec, Capability, Health, ProbeResult

BackendFactory = Callable[[BackendSpec], Backend]
BreakerFactory = Callable[[], CircuitBreaker]
Listener = Callable[["BackendState"], None]


@dataclass(slots=True, eq=False)
class BackendState:
    adapter: Backend
    breaker: CircuitBreaker
    health: Health = NOT_PROBED
    discovered: tuple[str, ...] = ()
    load: BackendLoad = field(default_factory=BackendLoad)
    """Requests sent and ended, and the last metrics reading (``app.routing.load``)."""
    reports_usage: bool = False
    """Set once the upstream reported usage in a stream, so relays stop counting text."""
    cooldown_until: float | None = None
    """Monotonic time until which the router passes this backend over (see router.py).
    Kept per replica and shared by ``SharedVerdicts`` when it starts, like the breaker."""
    _models: tuple[str, ...] = ()
    _index: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.load.max_concurrency = self.adapter.spec.max_concurrency
        self._reindex()

    @property
    def in_flight(self) -> int:
        """This replica's requests on the backend now."""
        return self.load.in_flight

    @property
    def spec(self) -> BackendSpec:
        return self.adapter.spec

    @property
    def name(self) -> str:
        return self.adapter.spec.name

    @property
    def kind(self) -> str:
        return self.adapter.kind

    @property
    def upstream(self) -> str:
        """What identifies the upstream across replicas: the registered URL (an
        evernight backend runs against a local tunnel port that differs per replica)."""
        return self.spec.configured_url or self.spec.url

    @property
    def models(self) -> tuple[str, ...]:
        """Advertised models: the static list, then discovered ids not already in it (the
        other way round for adapters that say ``static_models_first = False``)."""
        return self._models

    def supports(self, capability: Capability) -> bool:
        return capability in self.adapter.capabilities

    def served_name(self, model: str) -> str | None:
        """The name this backend knows ``model`` by, or None if it does not advertise it."""
        exact = self._index.get(model)
        return exact if exact is not None else self._index.get(canonical(model))

    def apply_probe(self, result: ProbeResult, health: Health) -> None:
        self.health = health
        if result.healthy:
            self.discovered = result.models
            self._reindex()
            # A breaker whose open period has passed waits for a trial call; if that
            # trial never reported back (it hung, or its task died) the backend would
            # stay out of rotation while probes say it is fine. A good probe is the
            # trial. An open breaker keeps its period: calls failed, not probes.
            if self.breaker.state is BreakerState.HALF_OPEN:
                self.breaker.record_success()

    def _reindex(self) -> None:
        static = self.adapter.spec.models
        ordered = (
            (*static, *self.discovered)
            if self.adapter.static_models_first
            else (*self.discovered, *static)
        )
        merged = list(dict.fromkeys(ordered))
        self._models = tuple(merged)
        index: dict[str, str] = {}
        for name in merged:
            index.setdefault(name, name)
            index.setdefault(canonical(name), name)
        self._index = index


class BackendRegistry:
    def __init__(self, factory: BackendFactory, breaker_factory: BreakerFactory) -> None:
        self._factory = factory
        self._breaker_factory = breaker_factory
        self._backends: dict[str, BackendState] = {}
        self._on_added: list[Listener] = []
        self._on_removed: list[Listener] = []

    def on_added(self, listener: Listener) -> None:
        """Call ``listener`` for every backend added or replaced (the prober listens)."""
        self._on_added.append(listener)

    def on_removed(self, listener: Listener) -> None:
        """Call ``listener`` with the old state of every backend removed or replaced, before
        the replacement is announced (caches keyed by name drop what the old one left)."""
        self._on_removed.append(listener)

    def upsert(
        self, spec: BackendSpec, *, same_upstream: bool = False
    ) -> tuple[BackendState, Backend | None]:
        """Add or replace a backend; the new state starts fail-closed (not probed yet).

        ``same_upstream`` says the replacement reaches the very same upstream by a new
        address (an evernight tunnel that moved): it inherits the health, breaker,
        cooldown and discovered models, so routing does not pause while it is probed.
        Returns the new state and the replaced adapter, which the caller closes.
        """
        previous = self._backends.get(spec.name)
        adapter = self._factory(spec)
        if same_upstream and previous is not None:
            state = BackendState(
                adapter=adapter,
                breaker=previous.breaker,
                health=previous.health,
                discovered=previous.discovered,
                reports_usage=previous.reports_usage,
                cooldown_until=previous.cooldown_until,
                load=previous.load,
            )
        else:
            state = BackendState(adapter=adapter, breaker=self._breaker_factory())
        self._backends[spec.name] = state
        if previous is not None:
            for removed_listener in self._on_removed:
                removed_listener(previous)
        for listener in self._on_added:
            listener(state)
        return state, None if previous is None else previous.adapter

    def remove(self, name: str) -> Backend | None:
        state = self._backends.pop(name, None)
        if state is None:
            return None
        for listener in self._on_removed:
            listener(state)
        return state.adapter

    def get(self, name: str) -> BackendState | None:
        return self._backends.get(name)

    def names(self) -> list[str]:
        return sorted(self._backends)

    def __iter__(self) -> Iterator[BackendState]:
        return iter(list(self._backends.values()))

    def __len__(self) -> int:
        return len(self._backends)

    def is_current(self, state: BackendState) -> bool:
        """False once ``state`` was replaced or removed (a probe result for it is stale)."""
        return self._backends.get(state.name) is state

    @contextlib.contextmanager
    def in_flight(self, state: BackendState) -> Iterator[None]:
        state.load.dispatched()
        try:
            yield
        finally:
            state.load.finished()
