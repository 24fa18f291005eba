"""Who pays for a call, decided before any upstream sees it.

Every metered call of a project passes here once, before routing:

- ``custom:<name>``: the project's own endpoint. Its single backend is the target (no
  shared pool, no failover); it is outside the quota.
- A BYO override key for (conversation, model prefix): the key goes to the backend in
  place of its own, and the call is outside the quota.
- Anything else counts against the project's quota: one atomic reservation, or a 429.

The custom LLM adapters are cached per project and name and rebuilt when the target
changes (a rotated secret, a new URL); they use the SSRF-guarded pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from app.domain.custom_llms.directory import CustomLlmDirectory, CustomTarget, parse_llm_id
from app.domain.gateway.parsing import ListedModelOut
from app.domain.overrides.index import OverrideIndex
from app.domain.quotas.gate import QuotaGate
from app.lib.http import UpstreamHttp
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.breaker import CircuitBreaker
from app.routing.errors import ModelNotFoundError
from app.routing.registry import BackendState
from app.routing.types import Health, HealthStatus

MAX_CUSTOM_ADAPTERS = 10_000
# A custom LLM is not probed: it is assumed up until calls say otherwise (its breaker).
_ASSUMED_UP = Health(HealthStatus.HEALTHY, "custom LLM (not probed)", None)


@dataclass(frozen=True, slots=True)
class Admission:
    model: str
    """The model to route: the request's, or the custom LLM's upstream model."""
    target: BackendState | None = None
    api_key: str | None = field(default=None, repr=False)
    is_custom: bool = False
    is_override_key: bool = False
    max_output_tokens: int | None = None
    """The custom LLM's limit, for callers that check ``max_tokens`` against it."""


class CallAdmission:
    def __init__(
        self,
        *,
        overrides: OverrideIndex,
        quotas: QuotaGate,
        custom: CustomLlmDirectory,
        custom_http: UpstreamHttp,
        breaker_threshold: int,
        breaker_open_seconds: float,
    ) -> None:
        self._overrides = overrides
        self._quotas = quotas
        self._custom = custom
        self._custom_http = custom_http
        self._breaker_threshold = breaker_threshold
        self._breaker_open_seconds = breaker_open_seconds
        self._adapters: OrderedDict[tuple[UUID, str], BackendState] = OrderedDict()

    async def admit(
        self,
        project_id: UUID | None,
        conversation_id: str | None,
        model: str,
        *,
        also_known_as: Sequence[str] = (),
    ) -> Admission:
        """Decide the call's path; raises 404 for an unknown custom LLM and 429 when
        the quota is spent. ``also_known_as`` are further names an override key may
        be attached to (a runtime profile's id besides its model)."""
        name = parse_llm_id(model)
        if name is not None:
            return await self._custom_call(project_id, name, model)
        if project_id is None:
            return Admission(model)  # a user's own call: no project quota, no overrides
        for candidate in (model, *also_known_as):
            matched = await self._overrides.match(project_id, conversation_id, candidate)
            if matched is not None:
                return Admission(model, api_key=matched.api_key, is_override_key=True)
        await self._quotas.check(project_id)
        return Admission(model)

    async def custom_models(self, project_id: UUID | None) -> list[ListedModelOut]:
        """The project's enabled custom LLMs, as ``/v1/models`` lists them."""
        if project_id is None:
            return []
        return [
            ListedModelOut(
                id=entry.llm_id,
                owned_by="custom",
                context_window=entry.context_window_tokens,
                max_output_tokens=entry.max_output_tokens,
            )
            for entry in await self._custom.listing(project_id)
        ]

    async def _custom_call(self, project_id: UUID | None, name: str, model: str) -> Admission:
        target = None if project_id is None else await self._custom.target(project_id, name)
        if target is None or not target.enabled:
            # A disabled one is as absent as another project's: the id says nothing.
            raise ModelNotFoundError(model)
        return Admission(
            target.model,
            target=self._state_for(target),
            is_custom=True,
            max_output_tokens=target.max_output_tokens,
        )

    def _state_for(self, target: CustomTarget) -> BackendState:
        key = (target.project_id, target.name)
        spec = target.backend_spec()
        state = self._adapters.get(key)
        if state is not None and state.spec == spec:
            self._adapters.move_to_end(key)
            return state
        # New or changed (URL, model, a rotated key): a fresh adapter and breaker. The
        # replaced adapter owns nothing (the pool is shared), so it is simply dropped.
        state = BackendState(
            adapter=OpenAICompatibleBackend(spec, self._custom_http),
            breaker=CircuitBreaker(
                threshold=self._breaker_threshold, open_seconds=self._breaker_open_seconds
            ),
            health=_ASSUMED_UP,
        )
        self._adapters[key] = state
        self._adapters.move_to_end(key)
        while len(self._adapters) > MAX_CUSTOM_ADAPTERS:
            self._adapters.popitem(last=False)
        return state
