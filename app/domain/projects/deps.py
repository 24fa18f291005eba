from __future__ import annotations

from typing import Any

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar import Request
from litestar.di import Provide

from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.deps import provide_principal
from app.domain.accounts.principals import Principal
from app.domain.projects.services import (
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


def projects_dependencies() -> dict[str, Provide]:
    return {
        "projects_service": Provide(create_service_provider(ProjectService)),
        "members_service": Provide(create_service_provider(ProjectMemberService)),
    }
