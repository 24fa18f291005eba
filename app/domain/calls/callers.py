"""Who pays for a call: every call that can cost money is charged to a project.

- A project API key charges its own project (an ``X-Arona-Project`` header is ignored).
- A user's access token names the project with ``X-Arona-Project`` (its id or slug);
  the user must be a member (owner or member) with an enabled account. Without the
  header the call is refused (400 ``project_required``); a project the user cannot
  charge is a 404 ``project_not_found``, as another tenant's project is everywhere.
  The project's quotas, override keys, custom LLMs and metering then apply as for its
  API keys, and usage records carry both the project and the user.
- Runtime tokens belong to the runtime API; the admin token has no project: both are
  refused (403 ``principal_not_allowed``).

Used by ``/v1`` (chat, embeddings, models, video) and JSON-RPC, HTTP and WebSocket.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.governance import KeyPolicy
from app.domain.accounts.principals import (
    ApiKeyPrincipal,
    Principal,
    RuntimePrincipal,
    UserPrincipal,
)
from app.domain.projects.memberships import ProjectMemberships
from app.lib.errors import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
)

PROJECT_HEADER = "X-Arona-Project"
PROJECT_HEADER_KEY = PROJECT_HEADER.lower()


@dataclass(frozen=True, slots=True)
class CallKey:
    """The credential (API key or runtime token) a call came with, and its
    governance: what admission enforces per key."""

    credential_id: UUID
    policy: KeyPolicy

    @classmethod
    def of(cls, principal: Principal) -> CallKey | None:
        if isinstance(principal, ApiKeyPrincipal):
            return cls(principal.key_id, principal.policy)
        if isinstance(principal, RuntimePrincipal):
            return cls(principal.token_id, principal.policy)
        return None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a call is for: always a project, and the API key or the user that called
    on its behalf."""

    project_id: UUID
    api_key_id: UUID | None
    user_id: UUID | None
    key: CallKey | None = None
    """The API key's governance (``None`` for a user's call)."""

    @property
    def scope(self) -> str:
        """Namespace of conversation pins: the project."""
        return str(self.project_id)


class CallerResolver:
    __slots__ = ("_authenticator", "_memberships")

    def __init__(self, authenticator: Authenticator, memberships: ProjectMemberships) -> None:
        self._authenticator = authenticator
        self._memberships = memberships

    async def caller(self, authorization: str | None, project: str | None) -> Caller:
        """The caller behind an ``Authorization`` header and an ``X-Arona-Project``."""
        principal = await self._authenticator.authenticate(authorization)
        if principal is None:
            raise AuthenticationError("authentication required", code="missing_credentials")
        return await self.of(principal, project)

    async def of(self, principal: Principal, project: str | None) -> Caller:
        if isinstance(principal, ApiKeyPrincipal):
            return Caller(principal.project_id, principal.key_id, None, CallKey.of(principal))
        if isinstance(principal, UserPrincipal):
            if project is None or not project.strip():
                raise BadRequestError(
                    f"a user access token must name the project to charge: send the "
                    f"{PROJECT_HEADER} header with the id or slug of a project you are a "
                    "member of (or call with one of the project's API keys)",
                    code="project_required",
                    param=PROJECT_HEADER,
                )
            project_id = await self._memberships.project_of(principal.user_id, project)
            if project_id is None:
                raise NotFoundError(
                    f"no project {project.strip()[:64]!r} among the projects you are a member of",
                    code="project_not_found",
                    param=PROJECT_HEADER,
                )
            return Caller(project_id, None, principal.user_id)
        raise PermissionDeniedError(
            f"this API takes a project API key, or a user access token with {PROJECT_HEADER}",
            code="principal_not_allowed",
        )
