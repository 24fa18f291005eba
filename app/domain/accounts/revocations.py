"""Revoked token ids, shared by every replica through the ``StateStore``.

A revoked JWT stays refused until it would have expired anyway; after that the
mark can go, so each entry carries a TTL equal to the token's remaining life.
"""

from __future__ import annotations

import time

from app.lib.state.base import StateStore

_PREFIX = "revoked:jti:"


class RevocationList:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    async def revoke(self, jti: str, expires_at_epoch: float) -> None:
        remaining = expires_at_epoch - time.time()
        if remaining <= 0:
            return
        await self._store.set(_PREFIX + jti, b"1", ttl=remaining + 1)

    async def is_revoked(self, jti: str) -> bool:
        return await self._store.exists(_PREFIX + jti)
