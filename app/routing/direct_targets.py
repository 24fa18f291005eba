"""Backends called directly, outside the shared pool: a project's custom LLM.

Such a backend is one call's ``target`` (no selection, no failover), so it is not in
the ``BackendRegistry``; but its adapter and breaker are built the registry's way,
by the same backend factory and breaker factory, so there is one way to build an
adapter. States are kept per key (a project and a name) and rebuilt when the spec
changes (a rotated secret, a new URL); the least recently used fall off past
``max_entries``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import KW_ONLY, dataclass, field

from app.routing.registry import BackendFactory, BackendState, BreakerFactory
from app.routing.types import BackendSpec, Health, HealthStatus

DEFAULT_MAX_ENTRIES = 10_000
# A direct target is not probed: it is assumed up until calls say otherwise (its breaker).
ASSUMED_UP = Health(HealthStatus.HEALTHY, "custom LLM (not probed)", None)


@dataclass(slots=True, eq=False)
class DirectTargets:
    factory: BackendFactory
    breaker_factory: BreakerFactory
    _: KW_ONLY
    max_entries: int = DEFAULT_MAX_ENTRIES
    _states: OrderedDict[Hashable, BackendState] = field(default_factory=OrderedDict, init=False)

    def state_for(self, key: Hashable, spec: BackendSpec) -> BackendState:
        """The live state of the backend ``spec`` describes, kept under ``key``."""
        state = self._states.get(key)
        if state is not None and state.spec == spec:
            self._states.move_to_end(key)
            return state
        # New or changed (URL, model, a rotated key): a fresh adapter and breaker. The
        # replaced adapter owns nothing (the pool is shared), so it is simply dropped.
        state = BackendState(
            adapter=self.factory(spec), breaker=self.breaker_factory(), health=ASSUMED_UP
        )
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > self.max_entries:
            self._states.popitem(last=False)
        return state

    def __len__(self) -> int:
        return len(self._states)
