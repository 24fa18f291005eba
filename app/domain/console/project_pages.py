"""The console's project pages: the list, creating one, and the way into a project's
settings tabs (served by ``tab_pages``; each is a fragment swapped into the page)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Controller, Request, get, post
from litestar.di import Provide
from litestar.response import Redirect, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.projects.services import ProjectAccess, ProjectService
from app.domain.web.pages import WebUser, csrf_guard, provide_page_principal, render
from app.lib.errors import AronaError

PAGE_SIZE = 100
TABS = (
    ("overview", "Overview"),
    ("custom-llms", "Custom LLMs"),
    ("secrets", "Secrets"),
    ("overrides", "Overrides"),
    ("quota", "Quotas and usage"),
    ("keys", "Keys"),
    ("models", "Models"),
    ("conversations", "Conversations"),
    ("webhooks", "Webhooks"),
)


async def _list(
    web_user: WebUser,
    projects_service: ProjectService,
    *,
    status_code: int = 200,
    errors: dict[str, str] | None = None,
    form: dict[str, str] | None = None,
) -> Template:
    """The projects the caller sees, with the create form (refilled after a refusal)."""
    rows, total = await projects_service.visible_page(web_user.principal, PAGE_SIZE, 0)
    return render(
        "console/projects.html",
        web_user,
        status_code=status_code,
        nav="projects",
        projects=rows,
        total=total,
        errors=errors or {},
        form=form,
    )


class ProjectPages(Controller):
    path = "/projects"
    include_in_schema = False
    guards = [csrf_guard]

    @get("/")
    async def list_projects(self, web_user: WebUser, projects_service: ProjectService) -> Template:
        return await _list(web_user, projects_service)

    @post("/", status_code=HTTP_303_SEE_OTHER)
    async def create_project(
        self, request: Request[Any, Any, Any], web_user: WebUser, projects_service: ProjectService
    ) -> Template | Redirect:
        form = await request.form()
        name = str(form.get("name") or "").strip()
        slug = str(form.get("slug") or "").strip() or None
        errors: dict[str, str] = {}
        if not name:
            errors["name"] = "Give the project a name."
        if not errors:
            try:
                project = await projects_service.create_owned(
                    name=name, slug=slug, owner_id=web_user.user.id
                )
            except AronaError as exc:
                errors[exc.param or "name"] = exc.message
            else:
                return Redirect(
                    f"/projects/{project.id}/tabs/overview", status_code=HTTP_303_SEE_OTHER
                )
        typed = {"name": name, "slug": slug or ""}
        return await _list(web_user, projects_service, status_code=400, errors=errors, form=typed)

    @get("/{project_id:uuid}", dependencies={"principal": Provide(provide_page_principal)})
    async def project_page(
        self,
        project_id: UUID,
        web_user: WebUser,
        access: ProjectAccess,
        tab: str = "overview",
    ) -> Redirect:
        """The project's page is its tab's page (``tab_pages``): one address per tab,
        rendered whole on the server, so no tab has to load after the page."""
        if tab not in dict(TABS):
            tab = "overview"
        return Redirect(f"/projects/{project_id}/tabs/{tab}")
