"""Browser sessions: an opaque cookie naming a record in the shared StateStore.

The cookie carries a random token; the store keeps, under the token's hash, the user,
the login (refresh-token family) it belongs to and the session's CSRF token. Every
request that uses the session pushes its expiry forward (idle expiry); logging out
deletes it and revokes the login. Kept in the StateStore, a session works on every
replica and ends everywhere at once.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from uuid import UUID

import msgspec

from app.domain.accounts.principals import UserPrincipal
from app.lib.hashing import sha256_hex
from app.lib.state.base import StateStore

COOKIE_NAME = "arona_session"
_KEY_PREFIX = "websession:"


class _Stored(msgspec.Struct, frozen=True):
    user_id: UUID
    family_id: UUID
    csrf: str
    created_at: float


@dataclass(frozen=True, slots=True)
class WebSession:
    token_hash: str
    user_id: UUID
    family_id: UUID
    csrf: str
    """Sent back by every form post and HTMX request (``X-CSRF-Token``)."""
    expires_at: float

    def principal(self) -> UserPrincipal:
        """The session as the principal the domain services check access with."""
        return UserPrincipal(
            user_id=self.user_id,
            jti=f"web:{self.token_hash}",
            expires_at=self.expires_at,
            family_id=self.family_id,
        )


class WebSessions:
    def __init__(self, store: StateStore, *, idle_seconds: float) -> None:
        self._store = store
        self.idle_seconds = idle_seconds

    async def create(self, user_id: UUID, family_id: UUID) -> tuple[str, WebSession]:
        """A new session; returns the cookie value (shown to no one else) and the session."""
        token = secrets.token_urlsafe(32)
        stored = _Stored(
            user_id=user_id,
            family_id=family_id,
            csrf=secrets.token_urlsafe(32),
            created_at=time.time(),
        )
        token_hash = sha256_hex(token)
        await self._store.set(
            _KEY_PREFIX + token_hash, msgspec.json.encode(stored), ttl=self.idle_seconds
        )
        return token, self._session(token_hash, stored)

    async def load(self, token: str | None) -> WebSession | None:
        """The live session for a cookie value, its idle expiry pushed forward."""
        if not token or len(token) > 128:
            return None
        token_hash = sha256_hex(token)
        raw = await self._store.get(_KEY_PREFIX + token_hash)
        if raw is None:
            return None
        try:
            stored = msgspec.json.decode(raw, type=_Stored)
        except msgspec.DecodeError:
            return None
        await self._store.set(_KEY_PREFIX + token_hash, raw, ttl=self.idle_seconds)
        return self._session(token_hash, stored)

    async def destroy(self, session: WebSession) -> None:
        await self._store.delete(_KEY_PREFIX + session.token_hash)

    def _session(self, token_hash: str, stored: _Stored) -> WebSession:
        return WebSession(
            token_hash=token_hash,
            user_id=stored.user_id,
            family_id=stored.family_id,
            csrf=stored.csrf,
            expires_at=time.time() + self.idle_seconds,
        )
