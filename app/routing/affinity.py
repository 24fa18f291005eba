"""Session affinity: a conversation stays on the backend that first served it.

Pins live in the ``StateStore`` (shared by every replica) with a TTL, namespaced by
a scope (the project) so two tenants' conversation ids never share a pin.
"""

from __future__ import annotations

from app.lib.state.base import StateStore

DEFAULT_PIN_TTL_SECONDS = 24 * 3600.0


class AffinityStore:
    def __init__(self, store: StateStore, *, ttl: float = DEFAULT_PIN_TTL_SECONDS) -> None:
        self._store = store
        self.ttl = ttl

    @staticmethod
    def _key(scope: str, conversation_id: str) -> str:
        return f"pin:{scope}:{conversation_id}"

    async def pinned(self, scope: str, conversation_id: str) -> str | None:
        raw = await self._store.get(self._key(scope, conversation_id))
        return None if raw is None else raw.decode()

    async def bind(self, scope: str, conversation_id: str, backend: str) -> None:
        await self._store.set(self._key(scope, conversation_id), backend.encode(), ttl=self.ttl)

    async def clear(self, scope: str, conversation_id: str) -> None:
        await self._store.delete(self._key(scope, conversation_id))
