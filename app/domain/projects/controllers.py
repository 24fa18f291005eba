"""Projects REST API: projects and members."""

from __future__ import annotations

from uuid import UUID

import msgspec
from litestar import Controller, delete, get, patch, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import Project, User
from app.domain.accounts.credential_services import RuntimeTokenService, TokenRevocationService
from app.domain.accounts.principals import Principal, UserPrincipal
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.services import UserService, normalize_email
from app.domain.accounts.sync import ApiKeySync
from app.domain.paging import DEFAULT_LIMIT, LimitQuery, OffsetQuery, Page
from app.domain.projects import lifecycle
from app.domain.projects.deps import projects_principal
from app.domain.projects.schemas import (
    MemberAdd,
    MemberOut,
    ProjectCreate,
    ProjectOut,
    ProjectUpdate,
)
from app.domain.projects.services import ProjectMemberService, ProjectService
from app.lib.errors import NotFoundError, PermissionDeniedError


def project_out(project: Project, role: str) -> ProjectOut:
    return ProjectOut(
        id=project.id,
        name=project.name,
        slug=project.slug,
        owner_id=project.owner_id,
        role=role,
        created_at=project.created_at,
        updated_at=project.updated_at,
    )


class ProjectController(Controller):
    path = "/api/projects"
    tags = ["projects"]
    dependencies = {"principal": projects_principal}

    @get("/")
    async def list_projects(
        self,
        principal: Principal,
        projects_service: ProjectService,
        limit: LimitQuery = DEFAULT_LIMIT,
        offset: OffsetQuery = 0,
    ) -> Page[ProjectOut]:
        rows, total = await projects_service.visible_page(principal, limit, offset)
        return Page(
            items=[project_out(p, role) for p, role in rows],
            total=total,
            limit=limit,
            offset=offset,
        )

    @post("/", status_code=HTTP_201_CREATED)
    async def create_project(
        self,
        data: ProjectCreate,
        principal: Principal,
        current_user: User,
        projects_service: ProjectService,
    ) -> ProjectOut:
        project = await projects_service.create_owned(
            name=data.name, slug=data.slug, owner_id=current_user.id
        )
        return project_out(project, "owner")

    @get("/{project_id:uuid}")
    async def get_project(
        self, project_id: UUID, principal: Principal, projects_service: ProjectService
    ) -> ProjectOut:
        access = await projects_service.access(principal, project_id)
        return project_out(access.project, access.role)

    @patch("/{project_id:uuid}")
    async def update_project(
        self,
        project_id: UUID,
        data: ProjectUpdate,
        principal: Principal,
        projects_service: ProjectService,
    ) -> ProjectOut:
        access = await projects_service.access(principal, project_id)
        access.require(access.can_manage_project, "change this project")
        project = await projects_service.rename(
            access.project,
            name=None if data.name is msgspec.UNSET else data.name,
            slug=None if data.slug is msgspec.UNSET else data.slug,
        )
        return project_out(project, access.role)

    @delete("/{project_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_project(
        self,
        project_id: UUID,
        principal: Principal,
        projects_service: ProjectService,
        runtime_tokens_service: RuntimeTokenService,
        token_revocations_service: TokenRevocationService,
        revocations: RevocationList,
        api_key_sync: ApiKeySync,
    ) -> None:
        access = await projects_service.access(principal, project_id)
        access.require(access.can_manage_project, "delete this project")
        await lifecycle.delete_project(
            access.project.id,
            projects_service=projects_service,
            runtime_tokens_service=runtime_tokens_service,
            token_revocations_service=token_revocations_service,
            revocations=revocations,
            api_key_sync=api_key_sync,
        )

    @get("/{project_id:uuid}/members")
    async def list_members(
        self,
        project_id: UUID,
        principal: Principal,
        projects_service: ProjectService,
        members_service: ProjectMemberService,
        limit: LimitQuery = DEFAULT_LIMIT,
        offset: OffsetQuery = 0,
    ) -> Page[MemberOut]:
        await projects_service.access(principal, project_id)
        rows, total = await members_service.page(project_id, limit, offset)
        items = [
            MemberOut(
                user_id=user.id,
                email=user.email,
                name=user.name,
                role=m.role,
                added_at=m.created_at,
            )
            for m, user in rows
        ]
        return Page(items=items, total=total, limit=limit, offset=offset)

    @post("/{project_id:uuid}/members", status_code=HTTP_201_CREATED)
    async def add_member(
        self,
        project_id: UUID,
        data: MemberAdd,
        principal: Principal,
        projects_service: ProjectService,
        members_service: ProjectMemberService,
        users_service: UserService,
    ) -> MemberOut:
        access = await projects_service.access(principal, project_id)
        access.require(access.can_manage_project, "manage members")
        user = await users_service.get_by_email(normalize_email(data.email))
        if user is None or user.disabled:
            raise NotFoundError(
                "no active user has this email", code="user_not_found", param="email"
            )
        member = await members_service.add(project_id, user, data.role)
        return MemberOut(
            user_id=user.id,
            email=user.email,
            name=user.name,
            role=member.role,
            added_at=member.created_at,
        )

    @delete("/{project_id:uuid}/members/{user_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def remove_member(
        self,
        project_id: UUID,
        user_id: UUID,
        principal: Principal,
        projects_service: ProjectService,
        members_service: ProjectMemberService,
    ) -> None:
        access = await projects_service.access(principal, project_id)
        # A member may leave on their own; removing others needs management rights.
        leaving_self = isinstance(principal, UserPrincipal) and principal.user_id == user_id
        if not (leaving_self or access.can_manage_project):
            raise PermissionDeniedError(
                f"your role ({access.role}) may not manage members", code="insufficient_role"
            )
        await members_service.remove(access.project, user_id)
