"""The Overview tab: the project's name and slug, its members, and deleting it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Controller, get, post
from litestar.response import Redirect, Response, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.accounts.credential_services import RuntimeTokenService, TokenRevocationService
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.sync import ApiKeySync
from app.domain.console.tab_support import (
    TAB_SCOPE,
    Forms,
    FormState,
    ProjectView,
    Tab,
    TabScope,
    compact,
    parse,
)
from app.domain.projects import lifecycle
from app.domain.projects.schemas import MemberAdd, ProjectUpdate
from app.domain.projects.services import ProjectAccess, ProjectMemberService, ProjectService
from app.domain.web.pages import WebUser, csrf_guard
from app.lib.errors import AronaError

KEY = "overview"
MEMBERS_SHOWN = 200
ROLES = (("member", "Member (reads)"), ("owner", "Owner (manages)"))


async def _context(
    scope: TabScope, members_service: ProjectMemberService, forms: Forms | None = None
) -> dict[str, Any]:
    rows, total = await members_service.page(scope.project.id, MEMBERS_SHOWN, 0)
    members = [
        {
            "user_id": user.id,
            "email": user.email,
            "name": user.name,
            "role": member.role,
            "added_at": member.created_at,
            "is_owner": user.id == scope.project.owner_id,
            "is_me": user.id == scope.web_user.user.id,
        }
        for member, user in rows
    ]
    return {"members": members, "members_total": total, "roles": ROLES, "forms": forms or Forms()}


def _tab(scope: TabScope, members_service: ProjectMemberService) -> Tab:
    return scope.tab(KEY, lambda: _context(scope, members_service))


def _to_list(scope: TabScope) -> Response[Any]:
    """After the project is gone (or left): back to the list of projects."""
    if scope.fragment:
        return Response(content=b"", status_code=200, headers={"HX-Redirect": "/projects"})
    return Redirect("/projects", status_code=HTTP_303_SEE_OTHER)


class OverviewTab(Controller):
    path = "/projects/{project_id:uuid}"
    include_in_schema = False
    guards = [csrf_guard]
    dependencies = TAB_SCOPE

    @get("/tabs/overview")
    async def show(
        self,
        tab_scope: TabScope,
        members_service: ProjectMemberService,
    ) -> Template:
        return await _tab(tab_scope, members_service).show()

    @post("/rename")
    async def rename(
        self,
        tab_scope: TabScope,
        projects_service: ProjectService,
        members_service: ProjectMemberService,
    ) -> Template:
        tab = _tab(tab_scope, members_service)
        tab_scope.require_project("change this project")
        form = await tab_scope.form()
        values = {"name": form.text("name"), "slug": form.text("slug")}
        try:
            data = parse(
                ProjectUpdate, {"name": values["name"], **compact({"slug": values["slug"]})}
            )
            project = await projects_service.rename(tab_scope.access.project, data)
        except AronaError as exc:
            return await tab.refuse("rename", exc, ("name", "slug"), values)
        tab_scope.project = ProjectView.of(ProjectAccess(project, tab_scope.access.role))
        return await tab.show("Project renamed.")

    @post("/delete")
    async def delete_project(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        projects_service: ProjectService,
        members_service: ProjectMemberService,
        runtime_tokens_service: RuntimeTokenService,
        token_revocations_service: TokenRevocationService,
        revocations: RevocationList,
        api_key_sync: ApiKeySync,
    ) -> Response[Any]:
        tab = _tab(tab_scope, members_service)
        tab_scope.require_project("delete this project")
        form = await tab_scope.form()
        typed = form.text("confirm")
        if typed != tab_scope.project.name:
            state = FormState(
                values={"confirm": typed},
                errors={"confirm": "Type the project's name exactly to confirm."},
                failed=True,
            )
            return await tab_scope.refused(KEY, "delete", state, **await tab.load())
        await lifecycle.delete_project(
            project_id,
            projects_service=projects_service,
            runtime_tokens_service=runtime_tokens_service,
            token_revocations_service=token_revocations_service,
            revocations=revocations,
            api_key_sync=api_key_sync,
        )
        return _to_list(tab_scope)

    @post("/members")
    async def add_member(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        members_service: ProjectMemberService,
    ) -> Template:
        tab = _tab(tab_scope, members_service)
        tab_scope.require_project("manage members")
        form = await tab_scope.form()
        values = {"email": form.text("email"), "role": form.text("role") or "member"}
        try:
            data = parse(MemberAdd, values)
            _, user = await members_service.add_by_email(project_id, data.email, data.role)
        except AronaError as exc:
            return await tab.refuse("member", exc, ("email", "role"), values)
        return await tab.show(f"{user.email} added as {data.role}.")

    @post("/members/{user_id:uuid}/remove")
    async def remove_member(
        self,
        tab_scope: TabScope,
        user_id: UUID,
        web_user: WebUser,
        members_service: ProjectMemberService,
    ) -> Response[Any]:
        leaving = user_id == web_user.user.id
        tab_scope.access.require_member_removal(web_user.user.id, user_id)
        await members_service.remove(tab_scope.access.project, user_id)
        if leaving and not tab_scope.web_user.is_admin:
            return _to_list(tab_scope)
        message = "You left the project." if leaving else "Member removed."
        return await _tab(tab_scope, members_service).show(message)
