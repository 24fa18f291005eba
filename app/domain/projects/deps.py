from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.projects.services import ProjectMemberService, ProjectService


def projects_dependencies() -> dict[str, Provide]:
    return {
        "projects_service": Provide(create_service_provider(ProjectService)),
        "members_service": Provide(create_service_provider(ProjectMemberService)),
    }
