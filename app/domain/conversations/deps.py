"""Dependency providers of the conversations area (resolved by name by Litestar).

Both route sets take a ``conversation_scope``: the project the caller acts in and
whether it may write there. The runtime routes get it from the runtime JWT, the
Projects API routes from the ``projectId`` path parameter and the caller's role.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.accounts.principals import Principal, RuntimePrincipal
from app.domain.conversations.pins import FallbackPinService
from app.domain.conversations.services import ConversationService
from app.domain.projects.services import ProjectAccess
from app.lib.errors import PermissionDeniedError

# Who may write a project's conversations on the Projects API: owners and platform
# admins, and the project's API keys (automation), as for the project's credentials.
WRITER_ROLES = frozenset({"admin", "owner", "api_key"})


@dataclass(frozen=True, slots=True)
class ConversationScope:
    project_id: UUID
    role: str
    """``runtime`` for a runtime token, else the caller's project role."""

    @property
    def can_write(self) -> bool:
        return self.role == "runtime" or self.role in WRITER_ROLES

    def require_write(self, action: str) -> None:
        if not self.can_write:
            raise PermissionDeniedError(
                f"your role ({self.role}) may not {action}", code="insufficient_role"
            )


async def provide_runtime_scope(principal: Principal) -> ConversationScope:
    if not isinstance(principal, RuntimePrincipal):
        raise PermissionDeniedError(
            "this endpoint needs a runtime token", code="runtime_token_required"
        )
    return ConversationScope(project_id=principal.project_id, role="runtime")


async def provide_project_scope(access: ProjectAccess) -> ConversationScope:
    """A project the caller cannot see is a 404 (``project_not_found``): see the
    projects area's ``access``."""
    return ConversationScope(project_id=access.project.id, role=access.role)


runtime_scope = Provide(provide_runtime_scope)
project_scope = Provide(provide_project_scope)


def conversations_dependencies() -> dict[str, Provide]:
    return {
        "conversations_service": Provide(create_service_provider(ConversationService)),
        "pins_service": Provide(create_service_provider(FallbackPinService)),
    }
