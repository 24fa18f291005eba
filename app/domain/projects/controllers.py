"""Projects REST API: projects and members."""

from __future__ import annotations

from uuid import UUID

from litestar import delete, get, patch, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import ProjectMember, User
from app.domain.accounts.credential_services import RuntimeTokenService, TokenRevocationService
from app.domain.accounts.principals import Principal, UserPrincipal
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.sync import ApiKeySync
from app.domain.paging import Page, Paging, from_row
from app.domain.projects import lifecycle
from app.domain.projects.schemas import (
    MemberAdd,
    MemberOut,
    ProjectCreate,
    ProjectOut,
    ProjectUpdate,
)
from app.domain.projects.services import ProjectAccess, ProjectMemberService, ProjectService
from app.domain.rest import ProjectApiController, principal_paging

# ``role`` is given (the caller's role in the project): ``project_out(project, role=...)``.
project_out = from_row(ProjectOut)


# The user's fields; the membership's are given (``role=``, ``added_at=``).
_member_fields = from_row(MemberOut, user_id=lambda user: user.id)


def member_out(member: ProjectMember, user: User) -> MemberOut:
    return _member_fields(user, role=member.role, added_at=member.created_at)


class ProjectController(ProjectApiController):
    path = "/api/projects"

    # Not a project's list: paged after the caller alone (there is no ``access``).
    @get("/", dependencies={"paging": principal_paging()})
    async def list_projects(
        self, principal: Principal, projects_service: ProjectService, paging: Paging
    ) -> Page[ProjectOut]:
        rows, total = await projects_service.visible_page(principal, paging.limit, paging.offset)
        return paging.page(rows, total, lambda row: project_out(row[0], role=row[1]))

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
        return project_out(project, role="owner")

    @get("/{project_id:uuid}")
    async def get_project(self, access: ProjectAccess) -> ProjectOut:
        return project_out(access.project, role=access.role)

    @patch("/{project_id:uuid}")
    async def update_project(
        self,
        access: ProjectAccess,
        data: ProjectUpdate,
        projects_service: ProjectService,
    ) -> ProjectOut:
        access.require(access.can_manage_project, "change this project")
        project = await projects_service.rename(access.project, data)
        return project_out(project, role=access.role)

    @delete("/{project_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_project(
        self,
        access: ProjectAccess,
        projects_service: ProjectService,
        runtime_tokens_service: RuntimeTokenService,
        token_revocations_service: TokenRevocationService,
        revocations: RevocationList,
        api_key_sync: ApiKeySync,
    ) -> None:
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
        access: ProjectAccess,
        members_service: ProjectMemberService,
        paging: Paging,
    ) -> Page[MemberOut]:
        rows, total = await members_service.page(project_id, paging.limit, paging.offset)
        return paging.page(rows, total, lambda row: member_out(*row))

    @post("/{project_id:uuid}/members", status_code=HTTP_201_CREATED)
    async def add_member(
        self,
        project_id: UUID,
        access: ProjectAccess,
        data: MemberAdd,
        members_service: ProjectMemberService,
    ) -> MemberOut:
        access.require(access.can_manage_project, "manage members")
        member, user = await members_service.add_by_email(project_id, data.email, data.role)
        return member_out(member, user)

    @delete("/{project_id:uuid}/members/{user_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def remove_member(
        self,
        access: ProjectAccess,
        user_id: UUID,
        principal: Principal,
        members_service: ProjectMemberService,
    ) -> None:
        caller = principal.user_id if isinstance(principal, UserPrincipal) else None
        access.require_member_removal(caller, user_id)
        await members_service.remove(access.project, user_id)
