from __future__ import annotations

from typing import Any
from uuid import UUID

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar import Request
from litestar.di import Provide

from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.deps import provide_principal
from app.domain.accounts.principals import Principal
from app.domain.projects.services import (
    ProjectAccess,
    ProjectMemberService,
    ProjectService,
    refuse_runtime_tokens,
)


async def provide_projects_principal(
    request: Request[Any, Any, Any], authenticator: Authenticator
) -> Principal:
    """The caller of the Projects API: a runtime token is refused on every route
    (before any other dependency, such as ``current_user``, answers differently)."""
    principal = await provide_principal(request, authenticator)
    refuse_runtime_tokens(principal)
    return principal


# Set as the ``principal`` dependency of every Projects API controller.
projects_principal = Provide(provide_projects_principal)


async def provide_project_access(
    project_id: UUID, principal: Principal, projects_service: ProjectService
) -> ProjectAccess:
    """The caller's access to the ``project_id`` of the path: the one tenancy check of
    every project-scoped route. A project the caller cannot see is a 404
    ``project_not_found``; a handler that asks for ``access`` gets this check even if it
    reads nothing from it, and checks the role an action needs itself
    (``access.require(...)``)."""
    return await projects_service.access(principal, project_id)


def projects_dependencies() -> dict[str, Provide]:
    return {
        "access": Provide(provide_project_access),
        "projects_service": Provide(create_service_provider(ProjectService)),
        "members_service": Provide(create_service_provider(ProjectMemberService)),
    }
