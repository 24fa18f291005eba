"""What the REST controllers share: the bases of the admin and Projects API
controllers (their dependencies), and the ``paging`` of their lists.

``paging`` declares a list's ``limit`` and ``offset`` query parameters once: they are
still documented on every list operation with their bounds, and a bad value is still a
400 naming it. Each provider takes the controller's gate (platform admin, project
access, conversation scope, projects principal) as a sub-dependency because Litestar
validates a dependency's own query parameters when it resolves that dependency: a
caller who may not see the list gets its 401, 403 or 404 before a 400 for ``limit``,
as when every handler took the two parameters itself (they were checked after every
dependency).
"""

from __future__ import annotations

from litestar import Controller
from litestar.di import Provide

from app.domain.accounts.principals import Principal
from app.domain.backends.deps import platform_admin
from app.domain.conversations.deps import ConversationScope
from app.domain.paging import DEFAULT_LIMIT, LimitQuery, OffsetQuery, Paging
from app.domain.projects.deps import projects_principal
from app.domain.projects.services import ProjectAccess


async def provide_admin_paging(
    platform_admin: Principal, limit: LimitQuery = DEFAULT_LIMIT, offset: OffsetQuery = 0
) -> Paging:
    return Paging(limit, offset)


async def provide_project_paging(
    access: ProjectAccess, limit: LimitQuery = DEFAULT_LIMIT, offset: OffsetQuery = 0
) -> Paging:
    return Paging(limit, offset)


async def provide_scope_paging(
    conversation_scope: ConversationScope,
    limit: LimitQuery = DEFAULT_LIMIT,
    offset: OffsetQuery = 0,
) -> Paging:
    return Paging(limit, offset)


async def provide_principal_paging(
    principal: Principal, limit: LimitQuery = DEFAULT_LIMIT, offset: OffsetQuery = 0
) -> Paging:
    return Paging(limit, offset)


def scope_paging() -> Provide:
    """``paging`` for the conversation routes, after their ``conversation_scope``."""
    return Provide(provide_scope_paging)


def principal_paging() -> Provide:
    """``paging`` for a list that is not a project's (the caller's projects)."""
    return Provide(provide_principal_paging)


class AdminController(Controller):
    """Base of the ``/api/admin/...`` controllers (never registered itself). Each
    handler takes ``platform_admin``: an unauthenticated call is a 401, a non-admin
    one a 403."""

    dependencies = {"platform_admin": platform_admin, "paging": Provide(provide_admin_paging)}


class ProjectApiController(Controller):
    """Base of the Projects API controllers (never registered itself): the caller is
    the Projects API principal (runtime tokens refused), and a project's lists are
    paged once its ``access`` is known."""

    tags = ["projects"]
    dependencies = {"principal": projects_principal, "paging": Provide(provide_project_paging)}
