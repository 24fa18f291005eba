"""Selection: which backend serves this call.

The pipeline of DESIGN.md: resolve the alias, filter (provider hint, capability,
advertises the model, carries every required tag, healthy, breaker not open, not
excluded by an earlier failed attempt, not cooling down), honour the conversation pin,
then pick the lowest score with round-robin among ties so equal backends share load
evenly. The score is the local in-flight count, plus ``running + 10 * waiting`` from the
backend's own metrics where it publishes them (vLLM), or a 1,000,000 penalty when those
metrics are unavailable.

Cooldown: a call that failed retryably (transport error, 5xx, 408/429, a stream cut
short; exactly what counts as a breaker failure) puts its backend in cooldown for
``cooldown_seconds``. While any other usable candidate is not cooling, cooling backends
are passed over (a conversation pinned to one moves and is re-bound). When every usable
candidate is cooling they are all used as usual, lowest score first: the circuit breaker
(consecutive failures) is the hard stop, and a pool of one must not answer 500 for the
whole cooldown after a single failure. Any call the backend answered (success, or a 4xx
that is the request's fault) clears its cooldown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from app.routing.affinity import AffinityStore
from app.routing.aliases import AliasTable
from app.routing.errors import ModelNotFoundError, NoHealthyBackendError, NotAVideoModelError
from app.routing.registry import BackendRegistry, BackendState
from app.routing.types import Capability, Clock, RouteHints, monotonic
from app.routing.vllm_metrics import VllmMetricsCache, score

DEFAULT_COOLDOWN_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Selection:
    state: BackendState
    served_model: str
    """The name the chosen backend advertises the model under (``x`` -> ``x:latest``)."""


def _matches_provider(state: BackendState, provider: str | None) -> bool:
    if not provider:
        return True
    wanted = provider.casefold()
    return state.name.casefold() == wanted or state.kind.casefold() == wanted


class Router:
    def __init__(
        self,
        registry: BackendRegistry,
        aliases: AliasTable,
        affinity: AffinityStore,
        *,
        metrics: VllmMetricsCache | None = None,
        cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS,
        clock: Clock = monotonic,
    ) -> None:
        self._registry = registry
        self._aliases = aliases
        self._affinity = affinity
        self._metrics = metrics
        self.cooldown_seconds = cooldown_seconds
        self._clock = clock
        self._turn = 0
        self._verdict_listeners: list[Callable[[BackendState], None]] = []
        registry.on_removed(self._forget)

    def on_verdict(self, listener: Callable[[BackendState], None]) -> None:
        """Call ``listener`` when a backend's breaker opens or closes or it starts
        cooling (``SharedVerdicts`` tells the other replicas)."""
        self._verdict_listeners.append(listener)

    def verdict_changed(self, state: BackendState) -> None:
        for listener in self._verdict_listeners:
            listener(state)

    def _forget(self, state: BackendState) -> None:
        # A replacement may point elsewhere: its load must be scraped afresh.
        if self._metrics is not None:
            self._metrics.forget(state.name)

    def cool_down(self, state: BackendState) -> None:
        state.cooldown_until = self._clock() + self.cooldown_seconds

    def clear_cooldown(self, state: BackendState) -> None:
        state.cooldown_until = None

    def cool_for(self, state: BackendState, seconds: float) -> None:
        """Cool for exactly ``seconds`` (another replica's cooldown; 0 clears it)."""
        state.cooldown_until = self._clock() + seconds if seconds > 0 else None

    def cooling_remaining(self, state: BackendState) -> float:
        until = state.cooldown_until
        return 0.0 if until is None else max(0.0, until - self._clock())

    def is_cooling(self, state: BackendState) -> bool:
        until = state.cooldown_until
        return until is not None and self._clock() < until

    def resolve(self, model: str) -> str:
        return self._aliases.resolve(model)

    def alias_items(self) -> list[tuple[str, str]]:
        return self._aliases.items()

    def can_serve(self, model: str, tags: frozenset[str] = frozenset()) -> bool:
        """Whether a chat for ``model`` (alias or name) on backends carrying ``tags``
        has a usable backend right now: what failover asks of a chain link."""
        try:
            self.candidates(self.resolve(model), "chat", RouteHints(tags=tags))
        except (ModelNotFoundError, NoHealthyBackendError):
            return False
        return True

    def candidates(self, model: str, capability: Capability, hints: RouteHints) -> list[Selection]:
        """Usable backends for ``model`` (already alias-resolved).

        Raises ``ModelNotFoundError`` when no backend advertises it for ``capability``
        (with the required tags; ``NotAVideoModelError`` when only chat or embeddings
        backends do and video was asked for) and ``NoHealthyBackendError`` when some do
        but none can take the call now.
        """
        known: list[Selection] = []
        lacks_tags = False
        for state in self._registry:
            if not state.supports(capability) or not _matches_provider(state, hints.provider):
                continue
            served = state.served_name(model)
            if served is None:
                continue
            if not hints.tags <= state.spec.tags:
                lacks_tags = True
                continue
            known.append(Selection(state, served))
        if not known:
            if lacks_tags:
                raise ModelNotFoundError(
                    model, f"requires backend tags: {', '.join(sorted(hints.tags))}"
                )
            raise self._not_found(model, capability, hints)
        usable = [
            s
            for s in known
            if s.state.health.healthy
            and s.state.breaker.can_accept()
            and s.state.name not in hints.exclude
        ]
        if not usable:
            raise NoHealthyBackendError(model, _why_unusable(known, hints))
        warm = [s for s in usable if not self.is_cooling(s.state)]
        return warm or usable

    def _not_found(self, model: str, capability: Capability, hints: RouteHints) -> Exception:
        """Why nobody serves ``model`` for ``capability``: a model advertised only by
        backends of another capability is named as such (a chat model asked for video is
        a 400 ``not_a_video_model``; a video model asked for chat says so in its 404)."""
        others = {
            c
            for state in self._registry
            if _matches_provider(state, hints.provider) and state.served_name(model) is not None
            for c in state.adapter.capabilities
        }
        if not others:
            return ModelNotFoundError(model)
        if capability == "video":
            return NotAVideoModelError(model)
        if others == {"video"}:
            return ModelNotFoundError(model, "a video model: use /v1/video/generations")
        return ModelNotFoundError(model, f"not served for {capability}")

    async def select(self, model: str, capability: Capability, hints: RouteHints) -> Selection:
        usable = self.candidates(model, capability, hints)
        pin_key = (
            affinity_key(hints.conversation_id, model, hints.tags)
            if hints.conversation_id
            else None
        )
        pinned: str | None = None
        if pin_key:
            pinned = await self._affinity.pinned(hints.affinity_scope, pin_key)
            for selection in usable:
                if selection.state.name == pinned and selection.state.breaker.acquire():
                    return selection
        chosen = self._pick_lowest_score(usable, await self._scores(usable))
        if pin_key and chosen.state.name != pinned:
            await self._affinity.bind(hints.affinity_scope, pin_key, chosen.state.name)
        return chosen

    async def _scores(self, usable: list[Selection]) -> list[float]:
        """``running + 10 * waiting + local in-flight`` where a backend publishes its
        load (vLLM), else the local in-flight count alone."""
        scores = [float(s.state.in_flight) for s in usable]
        if self._metrics is None:
            return scores
        cache = self._metrics
        measured = [
            (i, s.state.name, source)
            for i, s in enumerate(usable)
            if (source := s.state.adapter.metrics_source()) is not None
        ]
        if measured:
            loads = await asyncio.gather(*(cache.load(name, src) for _, name, src in measured))
            for (i, _, _), load in zip(measured, loads, strict=True):
                scores[i] = score(load, usable[i].state.in_flight)
        return scores

    def _pick_lowest_score(self, usable: list[Selection], scores: list[float]) -> Selection:
        remaining = list(zip(scores, usable, strict=True))
        while remaining:
            lowest = min(value for value, _ in remaining)
            ties = sorted((s for value, s in remaining if value == lowest), key=_by_name)
            chosen = ties[self._turn % len(ties)]
            self._turn += 1
            if chosen.state.breaker.acquire():
                return chosen
            # A concurrent caller took the half-open trial between filter and pick.
            remaining = [(value, s) for value, s in remaining if s is not chosen]
        raise NoHealthyBackendError(usable[0].served_model, "circuit breakers open")


def affinity_key(conversation_id: str, model: str, tags: frozenset[str] = frozenset()) -> str:
    """A conversation's pin is per model and tag set: when a turn moves to another
    profile (a failover), the backend the old one was pinned to does not carry over."""
    key = f"{conversation_id}|{model}"
    if tags:
        key += "|" + ",".join(sorted(tags))
    return key


def _by_name(selection: Selection) -> str:
    return selection.state.name


def _why_unusable(known: list[Selection], hints: RouteHints) -> str:
    reasons = []
    for selection in known:
        state = selection.state
        if state.name in hints.exclude:
            why = "failed this request"
        elif not state.health.healthy:
            why = state.health.reason or state.health.status.value
        else:
            why = f"circuit breaker {state.breaker.state.value}"
        reasons.append(f"{state.name}: {why}")
    return "; ".join(reasons)
