"""Who is calling: the principals that credentials resolve to."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from app.domain.accounts.governance import UNRESTRICTED, KeyPolicy


class Principal:
    """Base of every principal.

    A plain base class rather than a ``Union``: handlers and dependencies annotate
    ``Principal`` and narrow with ``isinstance``.
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class UserPrincipal(Principal):
    user_id: UUID
    jti: str
    expires_at: float
    family_id: UUID | None = None
    """The login session (refresh-token family) the access token was issued for."""


@dataclass(frozen=True, slots=True)
class ApiKeyPrincipal(Principal):
    key_id: UUID
    project_id: UUID
    policy: KeyPolicy = UNRESTRICTED


@dataclass(frozen=True, slots=True)
class RuntimePrincipal(Principal):
    token_id: UUID
    project_id: UUID
    policy: KeyPolicy = UNRESTRICTED


@dataclass(frozen=True, slots=True)
class AdminTokenPrincipal(Principal):
    """The operator's static ``ARONA_ADMIN_TOKEN``: platform admin, no user behind it."""
