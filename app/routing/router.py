"""Selection: which backend serves this call.

The pipeline of DESIGN.md: resolve the alias, filter (provider hint, capability,
advertises the model, carries every required tag, healthy, breaker not open, not
excluded by an earlier failed attempt, not cooling down), score every candidate, prefer
the conversation's previous backend while its score is within a margin of the best,
else pick the lowest score with round-robin among ties so equal backends share load
evenly.

Scores come from ``app.routing.load`` on current inputs: a backend's last metrics
reading (vLLM) corrected by the requests the cluster sent it and saw end since, or a
1,000,000 penalty when its metrics are unavailable; a backend without metrics scores
by its in-flight count here. The router's default score is the seed's
``running + 10 * waiting`` or the capacity-aware one (``score_kind``); a call may ask
for either (a profile's choice, ``RouteHints.score``).

Affinity is a preference, not a pin: a conversation stays on the backend that served
its last turn (its prefix cache is warm there) while that backend scores within
``AFFINITY_MARGIN`` of the best candidate, and moves (and is re-bound) when it is
loaded.

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
from dataclasses import KW_ONLY, dataclass, field

from app.routing.affinity import AffinityStore
from app.routing.aliases import AliasTable
from app.routing.errors import ModelNotFoundError, NoHealthyBackendError, NotAVideoModelError
from app.routing.load import Estimate, score_of
from app.routing.pick import near_ties
from app.routing.registry import BackendRegistry, BackendState
from app.routing.types import Capability, Clock, RouteHints, ScoreKind, monotonic
from app.routing.vllm_metrics import VllmMetricsCache

DEFAULT_COOLDOWN_SECONDS = 30.0
DEFAULT_SCORE: ScoreKind = "capacity"
AFFINITY_MARGIN: dict[ScoreKind, float] = {"seed": 5.0, "capacity": 0.25}
"""How much worse than the best a conversation's previous backend may score and still
keep it: five running requests (less than one waiting, which counts ten) for the seed
score; a quarter of a second of expected wait for the capacity-aware one (a backend
with a free slot always qualifies against another with one)."""


@dataclass(frozen=True, slots=True)
class Selection:
    state: BackendState
    served_model: str
    """The name the chosen backend advertises the model under (``x`` -> ``x:latest``)."""


PROVIDER_KIND_ALIASES: dict[str, str] = {
    "cloud": "minimax-cloud",
    "minimax": "minimax-cloud",
    "cep": "engine",
}
"""Kind names a ``provider`` hint may use besides the registration types
(``external``, ``vllm``, ``ollama``, ``engine``, ``minimax-cloud``): the seed's names
for the cloud video API kind (``cloud``, also ``minimax``) and for CEP engines
(``cep``). Keys are case-folded; values are registration types."""


def _matches_provider(state: BackendState, provider: str | None) -> bool:
    """Whether ``state`` passes the hint: its name, its kind or an alias of its kind
    (``PROVIDER_KIND_ALIASES``), compared case-insensitively. No hint passes all."""
    if not provider:
        return True
    wanted = provider.casefold()
    kind = state.kind.casefold()
    return wanted in (state.name.casefold(), kind) or PROVIDER_KIND_ALIASES.get(wanted) == kind


@dataclass(slots=True, eq=False)
class Router:
    registry: BackendRegistry
    aliases: AliasTable
    affinity: AffinityStore
    _: KW_ONLY
    metrics: VllmMetricsCache | None = None
    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS
    score_kind: ScoreKind = DEFAULT_SCORE
    clock: Clock = monotonic
    _turn: int = field(default=0, init=False)
    _verdict_listeners: list[Callable[[BackendState], None]] = field(
        default_factory=list, init=False
    )

    def __post_init__(self) -> None:
        self.registry.on_removed(self._forget)

    def on_verdict(self, listener: Callable[[BackendState], None]) -> None:
        """Call ``listener`` when a backend's breaker opens or closes or it starts
        cooling (``SharedVerdicts`` tells the other replicas)."""
        self._verdict_listeners.append(listener)

    def verdict_changed(self, state: BackendState) -> None:
        for listener in self._verdict_listeners:
            listener(state)

    def _forget(self, state: BackendState) -> None:
        # A replacement may point elsewhere: its load must be scraped afresh.
        if self.metrics is not None:
            self.metrics.forget(state.name)

    def cool_down(self, state: BackendState) -> None:
        state.cooldown_until = self.clock() + self.cooldown_seconds

    def clear_cooldown(self, state: BackendState) -> None:
        state.cooldown_until = None

    def cool_for(self, state: BackendState, seconds: float) -> None:
        """Cool for exactly ``seconds`` (another replica's cooldown; 0 clears it)."""
        state.cooldown_until = self.clock() + seconds if seconds > 0 else None

    def cooling_remaining(self, state: BackendState) -> float:
        until = state.cooldown_until
        return 0.0 if until is None else max(0.0, until - self.clock())

    def is_cooling(self, state: BackendState) -> bool:
        until = state.cooldown_until
        return until is not None and self.clock() < until

    def resolve(self, model: str) -> str:
        return self.aliases.resolve(model)

    def alias_items(self) -> list[tuple[str, str]]:
        return self.aliases.items()

    def can_serve(self, model: str, tags: frozenset[str] = frozenset()) -> bool:
        """Whether a chat for ``model`` (alias or name) on backends carrying ``tags``
        has a usable backend right now: what failover asks of a chain link."""
        try:
            self.candidates(self.resolve(model), "chat", RouteHints(tags=tags))
        except (ModelNotFoundError, NoHealthyBackendError):
            return False
        return True

    def in_pool(self, base_model: str, tags: frozenset[str], model: str, backend: str) -> bool:
        """Whether a chat for ``model`` served by ``backend`` is a call to ``base_model``
        on a backend carrying ``tags`` (a profile's pool), aliases resolved."""
        state = self.registry.get(backend)
        if state is None or not tags <= state.spec.tags:
            return False
        return self.resolve(model) == self.resolve(base_model)

    def candidates(self, model: str, capability: Capability, hints: RouteHints) -> list[Selection]:
        """Usable backends for ``model`` (already alias-resolved).

        Raises ``ModelNotFoundError`` when no backend advertises it for ``capability``
        (with the required tags; ``NotAVideoModelError`` when only chat or embeddings
        backends do and video was asked for) and ``NoHealthyBackendError`` when some do
        but none can take the call now.
        """
        known: list[Selection] = []
        lacks_tags = False
        for state in self.registry:
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
            for state in self.registry
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
        kind = hints.score or self.score_kind
        scores = await self.scores([s.state for s in usable], kind)
        pin_key = (
            affinity_key(hints.conversation_id, model, hints.tags)
            if hints.conversation_id
            else None
        )
        pinned: str | None = None
        if pin_key:
            pinned = await self.affinity.pinned(hints.affinity_scope, pin_key)
            best = min(scores)
            for selection, value in zip(usable, scores, strict=True):
                if (
                    selection.state.name == pinned
                    and value <= best + AFFINITY_MARGIN[kind]
                    and selection.state.breaker.acquire()
                ):
                    return selection
        chosen = self._pick_lowest(usable, scores)
        if pin_key and chosen.state.name != pinned:
            await self.affinity.bind(hints.affinity_scope, pin_key, chosen.state.name)
        return chosen

    async def scores(self, states: list[BackendState], kind: ScoreKind) -> list[float]:
        """Each backend's score now (lower is better), its metrics refreshed as due."""
        if self.metrics is not None:
            cache = self.metrics
            pending = [
                cache.prepare(state.name, source, state.load)
                for state in states
                if (source := state.adapter.metrics_source()) is not None
            ]
            if pending:
                await asyncio.gather(*pending)
        return [score_of(kind, self.estimate(state)) for state in states]

    def estimate(self, state: BackendState) -> Estimate | None:
        """What routing believes about ``state``'s load now (None: metrics unavailable)."""
        if self.metrics is not None and state.adapter.metrics_source() is not None:
            return state.load.estimate()
        # No metrics: the requests in flight here are all there is to go on.
        in_flight = float(state.in_flight)
        return Estimate(in_flight, 0.0, state.load.capacity, None, None, 0)

    def _pick_lowest(self, usable: list[Selection], scores: list[float]) -> Selection:
        remaining = list(zip(scores, usable, strict=True))
        while remaining:
            ties = near_ties([value for value, _ in remaining], margin=0.0)
            ordered = sorted((remaining[i][1] for i in ties), key=_by_name)
            chosen = ordered[self._turn % len(ordered)]
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
