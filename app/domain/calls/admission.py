"""Who pays for a call, decided before any upstream sees it.

Every metered call of a project passes here once, before routing:

- ``custom:<name>``: the project's own endpoint. Its single backend is the target (no
  shared pool, no failover); it is outside the quota.
- A BYO override key for (conversation, model prefix): the key goes to the backend in
  place of its own, and the call is outside the quota.
- Anything else counts against the project's quota: one atomic reservation, or a 429.

Per-key governance (``CallKey``, the API key's or runtime token's ``KeyPolicy``)
comes first: a model outside the key's allowed models is a 403 ``model_not_allowed``
before any of the above, and the key's ``rpm`` is one more window in the same atomic
admission as the project's quota (on custom-LLM and override-key calls too: the key's
rate limits the key, whoever pays). ``tpm`` and the money budget are held but not
enforced yet: ``_reserve_key`` is where their reservation goes.

The custom LLM adapters come from ``app.routing.direct_targets`` (built by the routing
backend factory, cached per project and name, rebuilt when the target changes); the
server hands it a factory over the SSRF-guarded pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from app.domain.accounts.governance import ModelNotAllowedError
from app.domain.calls.callers import CallKey
from app.domain.custom_llms.directory import (
    CustomListing,
    CustomLlmDirectory,
    CustomTarget,
    parse_llm_id,
)
from app.domain.overrides.index import OverrideIndex
from app.domain.quotas.gate import KeyRate, QuotaGate
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
        key: CallKey | None = None,
        requested: Sequence[str] = (),
    ) -> Admission:
        """Decide the call's path; raises 403 for a model the key may not call, 404
        for an unknown custom LLM and 429 when the quota or the key's rate is spent.
        ``also_known_as`` are further names an override key may be attached to (a
        runtime profile's id besides its model). The key's allowed models are matched
        against ``requested`` (what the client asked for) when given, else against
        ``model`` and ``also_known_as``."""
        if key is not None and key.policy.limits_models:
            allow_model(key, requested or (model, *also_known_as))
        name = parse_llm_id(model)
        if name is not None:
            admission = await self._custom_call(project_id, name, model)
            await self._reserve_key(project_id, key, project_quota=False)
            return admission
        if project_id is None:
            return Admission(model)  # a user's own call: no project quota, no overrides
        for candidate in (model, *also_known_as):
            matched = await self._overrides.match(project_id, conversation_id, candidate)
            if matched is not None:
                await self._reserve_key(project_id, key, project_quota=False)
                return Admission(model, api_key=matched.api_key, is_override_key=True)
        await self._reserve_key(project_id, key, project_quota=True)
        return Admission(model)

    async def admit_job(
        self, project_id: UUID | None, *, model: str | None = None, key: CallKey | None = None
    ) -> None:
        """A video job: no custom LLM or override key serves one, so the project's
        quota and the key's own limits decide (403 for a model the key may not call,
        429 when a window is spent); a user's own job counts against none."""
        if key is not None and model is not None and key.policy.limits_models:
            allow_model(key, (model,))
        if project_id is not None:
            await self._reserve_key(project_id, key, project_quota=True)

    async def _reserve_key(
        self, project_id: UUID | None, key: CallKey | None, *, project_quota: bool
    ) -> None:
        """The one atomic admission of a call: the project's quota windows (unless
        the call is outside it) and the key's ``rpm`` window.

        The seam for the reservation primitive (``StateStore.reserve`` / ``settle`` /
        ``release``): the key's ``tpm`` (a minute window under the same hash tag,
        ``quota:{<project>}:k:<credential>:t:<minute>``, holding the call's token
        estimate) and its money budget (a day or month window per ``budget_period``,
        holding the estimated cost in micro-units) are to be reserved here, in the
        same step as these windows, under the call's hold id, and settled to actuals
        when the call is metered. Until then they are stored and shown, not enforced."""
        if project_id is None:
            return
        rate = None
        if key is not None and key.policy.rpm is not None:
            rate = KeyRate(key.credential_id, key.policy.rpm)
        await self._quotas.check(project_id, rate, project_quota=project_quota)

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


def allow_model(key: CallKey, names: Sequence[str]) -> None:
    """403 ``model_not_allowed`` (naming the first name) unless the key's allowed
    models cover one of ``names``."""
    if names and not key.policy.allows_any(names):
        raise ModelNotAllowedError(names[0], key.policy)
