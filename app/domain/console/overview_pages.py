"""The Overview tab: the project's name and slug, its members, and deleting it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import post
from litestar.response import Redirect, Response, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.accounts.credential_services import RuntimeTokenService, TokenRevocationService
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.sync import ApiKeySync
from app.domain.console.tab_support import (
    FormState,
    ProjectView,
    Tab,
    TabPages,
    TabScope,
    compact,
    parse,
)
from app.domain.projects import lifecycle
from app.domain.projects.schemas import MemberAdd, ProjectUpdate
from app.domain.projects.services import ProjectAccess, ProjectMemberService, ProjectService
from app.domain.web.pages import WebUser
from app.lib.errors import AronaError, BadRequestError, PermissionDeniedError

KEY = "overview"
MEMBERS_SHOWN = 200
ROLES = (("member", "Member (reads)"), ("owner", "Owner (manages)"))


async def _context(scope: TabScope, members_service: ProjectMemberService) -> dict[str, Any]:
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
    return {"members": members, "members_total": total, "roles": ROLES}


FIELDS = ("email", "role")
NOT_AN_OWNER = "Only the project's owners can add members."
NOT_AN_EMAIL = "Enter an email address, like name@example.com."


def _in_plain_words(exc: AronaError, email: str) -> AronaError:
    """The members service's refusals as the console says them, beside the email field
    (the REST API keeps its own messages)."""
    if exc.code == "user_not_found":
        message = f"No one has an Arona account with {email}: ask them to register, then add them."
        return BadRequestError(message, code=exc.code, param="email")
    if exc.code == "already_member":
        return BadRequestError(
            f"{email} is already a member of this project.", code=exc.code, param="email"
        )
    return exc


def _tab(tab_scope: TabScope, members_service: ProjectMemberService) -> Tab:
    return tab_scope.tab(KEY, lambda: _context(tab_scope, members_service))


def _to_list(scope: TabScope) -> Response[Any]:
    """After the project is gone (or left): back to the list of projects."""
    if scope.fragment:
        return Response(content=b"", status_code=200, headers={"HX-Redirect": "/projects"})
    return Redirect("/projects", status_code=HTTP_303_SEE_OTHER)


class OverviewTab(TabPages, tab=_tab, key=KEY):
    @post("/rename")
    async def rename(self, tab: Tab, projects_service: ProjectService) -> Template:
        tab.scope.require_project("change this project")
        form = await tab.scope.form()
        values = form.texts("name", "slug")
        try:
            data = parse(
                ProjectUpdate, {"name": values["name"], **compact({"slug": values["slug"]})}
            )
            project = await projects_service.rename(tab.scope.access.project, data)
        except AronaError as exc:
            return await tab.refuse("rename", exc, ("name", "slug"), values)
        tab.scope.project = ProjectView.of(ProjectAccess(project, tab.scope.access.role))
        return await tab.show("Project renamed.")

    @post("/delete")
    async def delete_project(
        self,
        tab: Tab,
        project_id: UUID,
        projects_service: ProjectService,
        runtime_tokens_service: RuntimeTokenService,
        token_revocations_service: TokenRevocationService,
        revocations: RevocationList,
        api_key_sync: ApiKeySync,
    ) -> Response[Any]:
        tab.scope.require_project("delete this project")
        form = await tab.scope.form()
        typed = form.text("confirm")
        if typed != tab.scope.project.name:
            state = FormState(
                values={"confirm": typed},
                errors={"confirm": "Type the project's name exactly to confirm."},
                failed=True,
            )
            return await tab.reject("delete", state)
        await lifecycle.delete_project(
            project_id,
            projects_service=projects_service,
            runtime_tokens_service=runtime_tokens_service,
            token_revocations_service=token_revocations_service,
            revocations=revocations,
            api_key_sync=api_key_sync,
        )
        return _to_list(tab.scope)

    @post("/members")
    async def add_member(
        self, tab: Tab, project_id: UUID, members_service: ProjectMemberService
    ) -> Template:
        if not tab.scope.access.can_manage_project:
            # A page left open after a change of role: say who can, not the role rule.
            raise PermissionDeniedError(NOT_AN_OWNER, code="insufficient_role")
        form = await tab.scope.form()
        values = {"email": form.text("email"), "role": form.text("role") or "member"}
        if "@" not in values["email"]:
            state = FormState(values=values, errors={"email": NOT_AN_EMAIL}, failed=True)
            return await tab.reject("member", state)
        try:
            data = parse(MemberAdd, values)
            _, user = await members_service.add_by_email(project_id, data.email, data.role)
        except AronaError as exc:
            return await tab.refuse("member", _in_plain_words(exc, values["email"]), FIELDS, values)
        return await tab.show(f"{user.email} added as {data.role}.")

    @post("/members/{user_id:uuid}/remove")
    async def remove_member(
        self, tab: Tab, user_id: UUID, web_user: WebUser, members_service: ProjectMemberService
    ) -> Response[Any]:
        leaving = user_id == web_user.user.id
        tab.scope.access.require_member_removal(web_user.user.id, user_id)
        await members_service.remove(tab.scope.access.project, user_id)
        if leaving and not tab.scope.web_user.is_admin:
            return _to_list(tab.scope)
        message = "You left the project." if leaving else "Member removed."
        return await tab.show(message)
