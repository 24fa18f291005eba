"""Who pays for a call, decided before any upstream sees it.

Every metered call of a project passes here once, before routing:

- ``custom:<name>``: the project's own endpoint. Its single backend is the target (no
  shared pool, no failover); it is outside the quota.
- A BYO override key for (conversation, model prefix): the key goes to the backend in
  place of its own, and the call is outside the quota.
- Anything else counts against the project's quota: one atomic reservation, or a 429.

Per-key governance (``CallKey``, the API key's or runtime token's ``KeyPolicy``)
comes first: a model outside the key's allowed models is a 403 ``model_not_allowed``
before any of the above. The key's ``rpm``, ``tpm`` and money budget are more windows
in the same atomic admission as the project's quota (on custom-LLM and override-key
calls too: the key's limits limit the key, whoever pays).

When a token limit or a budget applies (the project's or the key's), admission is a
reservation (``QuotaGate.reserve``): the call's estimated tokens and cost
(``CallEstimator``, from the ``CallShape`` the surface passes) are held with its
request, and the ``Hold`` rides on the ``Admission`` to the call's record; the meter
settles it to what the call used.

The custom LLM adapters come from ``app.routing.direct_targets`` (built by the routing
backend factory, cached per project and name, rebuilt when the target changes); the
server hands it a factory over the SSRF-guarded pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from uuid import UUID

from app.domain.accounts.governance import ModelNotAllowedError
from app.domain.calls.callers import CallKey
from app.domain.calls.estimate import CallEstimator, CallShape
from app.domain.custom_llms.directory import (
    CustomListing,
    CustomLlmDirectory,
    CustomTarget,
    parse_llm_id,
)
from app.domain.overrides.index import OverrideIndex
from app.domain.quotas.gate import CallEstimate, KeyLimits, QuotaGate
from app.domain.quotas.holds import CallHold
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
    hold: CallHold | None = field(default=None, repr=False)
    """The call's reservation, settled by the meter (``None``: nothing held)."""


class CallAdmission:
    def __init__(
        self,
        *,
        overrides: OverrideIndex,
        quotas: QuotaGate,
        custom: CustomLlmDirectory,
        custom_targets: DirectTargets,
        estimator: CallEstimator | None = None,
    ) -> None:
        self._overrides = overrides
        self._quotas = quotas
        self._custom = custom
        self._custom_targets = custom_targets
        self._estimator = estimator or CallEstimator(None)

    async def admit(
        self,
        project_id: UUID | None,
        conversation_id: str | None,
        model: str,
        *,
        also_known_as: Sequence[str] = (),
        key: CallKey | None = None,
        requested: Sequence[str] = (),
        shape: CallShape | None = None,
    ) -> Admission:
        """Decide the call's path; raises 403 for a model the key may not call, 404
        for an unknown custom LLM and 429 when a quota, token limit or budget (the
        project's or the key's) has no room. ``also_known_as`` are further names an
        override key may be attached to (a runtime profile's id besides its model).
        The key's allowed models are matched against ``requested`` (what the client
        asked for) when given, else against ``model`` and ``also_known_as``.
        ``shape`` is what the call's estimate is made of (without it, a call is held
        at no tokens and no cost and settles to its actual use)."""
        if key is not None and key.policy.limits_models:
            allow_model(key, requested or (model, *also_known_as))
        names = (model, *also_known_as)
        name = parse_llm_id(model)
        if name is not None:
            admission = await self._custom_call(project_id, name, model)
            if shape is not None and admission.max_output_tokens is not None:
                shape = _capped(shape, admission.max_output_tokens)
            hold = await self._reserve(
                project_id, key, shape, (model, admission.model), project_quota=False
            )
            return replace(admission, hold=hold)
        if project_id is None:
            return Admission(model)  # a user's own call: no project quota, no overrides
        for candidate in names:
            matched = await self._overrides.match(project_id, conversation_id, candidate)
            if matched is not None:
                hold = await self._reserve(project_id, key, shape, names, project_quota=False)
                return Admission(model, api_key=matched.api_key, is_override_key=True, hold=hold)
        hold = await self._reserve(project_id, key, shape, names, project_quota=True)
        return Admission(model, hold=hold)

    async def admit_job(
        self, project_id: UUID | None, *, model: str | None = None, key: CallKey | None = None
    ) -> None:
        """A video job: no custom LLM or override key serves one, so the project's
        request quota and the key's rate decide (403 for a model the key may not call,
        429 when a window is spent); a user's own job counts against none. A job's
        tokens and spend are not reserved: it is priced when it ends."""
        if key is not None and model is not None and key.policy.limits_models:
            allow_model(key, (model,))
        if project_id is not None:
            await self._quotas.check(project_id, key_limits(key), project_quota=True)

    async def _reserve(
        self,
        project_id: UUID | None,
        key: CallKey | None,
        shape: CallShape | None,
        names: Sequence[str],
        *,
        project_quota: bool,
    ) -> CallHold | None:
        """The one atomic admission of a call: the project's windows (unless the call
        is outside its quota) and the key's, holding the call's estimate where a
        token limit or budget counts it."""
        if project_id is None:
            return None

        async def estimate() -> CallEstimate:
            if shape is None:
                return CallEstimate(0, 0)
            return await self._estimator.estimate(
                shape, names, project_id, is_custom_or_override=not project_quota
            )

        return await self._quotas.reserve(
            project_id, key_limits(key), estimate, project_quota=project_quota
        )

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


def key_limits(key: CallKey | None) -> KeyLimits | None:
    """The key's rate, token and money limits (``None``: no key, or none set)."""
    if key is None:
        return None
    policy = key.policy
    if policy.rpm is None and policy.tpm is None and policy.budget_micros is None:
        return None
    return KeyLimits(
        key.credential_id,
        rpm=policy.rpm,
        tpm=policy.tpm,
        budget_micros=policy.budget_micros,
        budget_period="day" if policy.budget_period == "day" else "month",
    )


def _capped(shape: CallShape, cap: int) -> CallShape:
    if shape.output_cap is None or shape.output_cap > cap:
        return replace(shape, output_cap=cap)
    return shape


def allow_model(key: CallKey, names: Sequence[str]) -> None:
    """403 ``model_not_allowed`` (naming the first name) unless the key's allowed
    models cover one of ``names``."""
    if names and not key.policy.allows_any(names):
        raise ModelNotAllowedError(names[0], key.policy)
