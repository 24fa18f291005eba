"""Revoked token ids, shared by every replica through the ``StateStore``.

A revoked JWT stays refused until it would have expired anyway; after that the
mark can go, so each entry carries a TTL equal to the token's remaining life.

A login's refresh-token family is marked too when it ends (logout, a reused refresh
token, a disabled account): every access token minted from it carries the family id,
and all of them are refused from then on, not only the one that logged out. The mark
lives as long as such an access token can.

The marks are rebuilt from the database at start-up and when Redis goes away
(``app.domain.accounts.wiring``): the family from ``refresh_token.revoked_at``, runtime
tokens from their rows or, for a deleted project's, from ``token_revocation``.
"""

from __future__ import annotations

import time

from app.lib.state.base import StateStore

_PREFIX = "revoked:jti:"
_FAMILY_PREFIX = "revoked:family:"


class RevocationList:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    async def revoke(self, jti: str, expires_at_epoch: float) -> None:
        remaining = expires_at_epoch - time.time()
        if remaining <= 0:
            return
        await self._store.set(_PREFIX + jti, b"1", ttl=remaining + 1)

    async def revoke_family(self, family_id: str, until_epoch: float) -> None:
        remaining = until_epoch - time.time()
        if remaining <= 0:
            return
        await self._store.set(_FAMILY_PREFIX + family_id, b"1", ttl=remaining + 1)

    async def is_revoked(self, jti: str, family_id: str | None = None) -> bool:
        if await self._store.exists(_PREFIX + jti):
            return True
        return family_id is not None and await self._store.exists(_FAMILY_PREFIX + family_id)
