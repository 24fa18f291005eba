"""Who pays for a call, decided before any upstream sees it.

Every metered call of a project passes here once, before routing:

- ``custom:<name>``: the project's own endpoint. Its single backend is the target (no
  shared pool, no failover); it is outside the quota.
- A BYO override key for (conversation, model prefix): the key goes to the backend in
  place of its own, and the call is outside the quota.
- Anything else counts against the project's quota: one atomic reservation, or a 429.

The custom LLM adapters come from ``app.routing.direct_targets`` (built by the routing
backend factory, cached per project and name, rebuilt when the target changes); the
server hands it a factory over the SSRF-guarded pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from app.domain.custom_llms.directory import (
    CustomListing,
    CustomLlmDirectory,
    CustomTarget,
    parse_llm_id,
)
from app.domain.overrides.index import OverrideIndex
from app.domain.quotas.gate import QuotaGate
from app.routing.direct_targets import DirectTargets
from app.routing.errors import ModelNotFoundError
from app.routing.registry import BackendState


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
        custom_targets: DirectTargets,
    ) -> None:
        self._overrides = overrides
        self._quotas = quotas
        self._custom = custom
        self._custom_targets = custom_targets

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

    async def admit_job(self, project_id: UUID | None) -> None:
        """A video job: no custom LLM or override key serves one, so the project's
        quota alone decides (429 when it is spent); a user's own job counts against
        none."""
        if project_id is not None:
            await self._quotas.check(project_id)

    async def custom_llms(self, project_id: UUID | None) -> list[CustomListing]:
        """The project's enabled custom LLMs (``/v1/models`` lists them)."""
        if project_id is None:
            return []
        return await self._custom.listing(project_id)

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
        return self._custom_targets.state_for(
            (target.project_id, target.name), target.backend_spec()
        )
