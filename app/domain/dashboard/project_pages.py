"""The projects-and-quotas page (every project, its limits, editable, and what it has
used) and the usage page (platform totals by project, model, backend and day)."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

from litestar import get, post
from litestar.di import Provide
from litestar.params import QueryParameter
from litestar.response import Template

from app.db.models import Project, ProjectQuota
from app.domain.dashboard.charts import Chart, bar_rows, columns
from app.domain.dashboard.common import (
    ADMIN,
    AdminRequest,
    DashboardController,
    admin_page,
    checked,
    fragment,
    notify,
    text,
)
from app.domain.dashboard.usage import (
    DEFAULT_PERIOD,
    PERIODS,
    PlatformUsage,
    Totals,
    period_start,
    platform_usage,
    project_totals,
)
from app.domain.projects.services import PROJECT_NOT_FOUND, ProjectService
from app.domain.quotas.fields import FIELDS, read_limits
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.page_view import LimitView, form_values, limit_views
from app.domain.quotas.schemas import QuotaOut
from app.domain.quotas.services import ProjectQuotaService
from app.domain.quotas.views import quota_out
from app.domain.web.pages import WebUser
from app.lib.clock import utcnow
from app.lib.errors import NotFoundError

PAGE_SIZE = 50
ROW_TEMPLATE = "dashboard/partials/project_row.html"
PageQuery = Annotated[int, QueryParameter(ge=1, le=100_000)]


@dataclass(frozen=True, slots=True)
class Breakdown:
    """A section of the usage page: requests by one key, as a chart and a table."""

    key: str
    """``project``, ``model`` or ``backend`` (in ids, titles and captions)."""
    key_label: str
    """The table's first heading."""
    chart: Chart
    rows: list[Totals]


@dataclass(frozen=True, slots=True)
class ProjectView:
    project: Project
    owner_email: str
    quota: QuotaOut
    month: Totals | None
    """Usage records since the start of the month (UTC)."""

    @property
    def limits(self) -> list[LimitView]:
        """Every limit with its window's use (requests, tokens, spend)."""
        return limit_views(self.quota)


def _breakdowns(usage: PlatformUsage) -> list[Breakdown]:
    sections = (
        ("project", "Project", usage.by_project),
        ("model", "Model requested", usage.by_model),
        ("backend", "Backend", usage.by_backend),
    )
    return [
        Breakdown(
            key,
            label,
            bar_rows(f"chart-{key}s", f"Requests by {key}", [(t.label, t.requests) for t in rows]),
            rows,
        )
        for key, label, rows in sections
    ]


def _month_start(now: datetime.datetime) -> datetime.datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class ProjectViews:
    """Projects with their owner, limits and month's usage (the ``project_views``
    dependency of the projects pages)."""

    projects_service: ProjectService
    quotas_service: ProjectQuotaService
    gate: QuotaGate

    async def of(self, projects: list[Project]) -> list[ProjectView]:
        session = self.projects_service.repository.session
        ids = [p.id for p in projects]
        emails = await self.projects_service.owner_emails(projects)
        quota_rows = (
            {
                q.project_id: q
                for q in await self.quotas_service.get_many(ProjectQuota.project_id.in_(ids))
            }
            if ids
            else {}
        )
        month = await project_totals(session, ids, _month_start(utcnow()))
        quotas = await asyncio.gather(
            *(quota_out(pid, quota_rows.get(pid), self.gate) for pid in ids)
        )
        return [
            ProjectView(p, emails.get(p.owner_id, ""), quota, month.get(p.id))
            for p, quota in zip(projects, quotas, strict=True)
        ]

    async def one(self, project: Project) -> ProjectView:
        [view] = await self.of([project])
        return view

    async def project(self, project_id: UUID) -> Project:
        project = await self.projects_service.get_one_or_none(Project.id == project_id)
        if project is None:
            raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")
        return project


def _project_views(
    projects_service: ProjectService,
    project_quotas_service: ProjectQuotaService,
    quota_gate: QuotaGate,
) -> ProjectViews:
    return ProjectViews(projects_service, project_quotas_service, quota_gate)


async def _project_view(
    project_id: UUID, web_admin: WebUser, project_views: ProjectViews
) -> ProjectView:
    """The view of the project in the path (404 ``project_not_found``). It takes
    ``web_admin`` so that it is resolved after the admin check, not before it nor at
    the same time on the request's session."""
    return await project_views.one(await project_views.project(project_id))


def _quota_form(
    admin: AdminRequest, view: ProjectView, values: dict[str, Any], errors: dict[str, str]
) -> Template:
    template = "dashboard/partials/quota_form.html"
    return admin.form_fragment(template, p=view, values=values, errors=errors)


class ProjectQuotaPages(DashboardController):
    dependencies = {
        **ADMIN,
        "project_views": Provide(_project_views, sync_to_thread=False),
        "project_view": Provide(_project_view),
    }

    @get("/projects")
    async def projects_page(
        self,
        web_admin: WebUser,
        projects_service: ProjectService,
        project_views: ProjectViews,
        page: PageQuery = 1,
    ) -> Template:
        listed, total = await projects_service.visible_page(
            web_admin.principal, PAGE_SIZE, (page - 1) * PAGE_SIZE
        )
        views = await project_views.of([project for project, _ in listed])
        return admin_page(
            "dashboard/projects.html",
            web_admin,
            "projects",
            projects=views,
            total=total,
            page=page,
            pages=max(1, -(-total // PAGE_SIZE)),
        )

    @get("/projects/{project_id:uuid}/row")
    async def project_row(self, web_admin: WebUser, project_view: ProjectView) -> Template:
        return fragment(ROW_TEMPLATE, web_admin, p=project_view)

    @get("/projects/{project_id:uuid}/quota")
    async def quota_form(self, admin: AdminRequest, project_view: ProjectView) -> Template:
        ceilings = form_values(project_view.quota.admin_limits)
        values: dict[str, Any] = {f.effective: ceilings[f.wire] for f in FIELDS}
        values["fail_closed"] = project_view.quota.fail_closed
        return _quota_form(admin, project_view, values, {})

    @post("/projects/{project_id:uuid}/quota", status_code=200)
    async def set_quota(
        self,
        project_id: UUID,
        admin: AdminRequest,
        project_quotas_service: ProjectQuotaService,
        project_views: ProjectViews,
    ) -> Template:
        """The ceilings replaced as a whole, as the API's PUT does; every field is
        checked at once and each error shown beside its field."""
        project = await project_views.project(project_id)
        form = await admin.form()
        # The dashboard's forms name fields in snake_case (``tokens_per_day``).
        values: dict[str, Any] = {f.effective: text(form, f.effective) for f in FIELDS}
        values["fail_closed"] = checked(form, "fail_closed")
        limits, problems = read_limits({f.wire: values[f.effective] for f in FIELDS})
        if problems:
            errors = {f.effective: problems[f.wire].plain for f in FIELDS if f.wire in problems}
            return _quota_form(admin, await project_views.one(project), values, errors)
        await project_quotas_service.set_admin_limits(
            project_id, limits, fail_closed=values["fail_closed"]
        )
        view = await project_views.one(project)
        headers = notify(f"Limits of {project.name} saved.")
        return admin.fragment(ROW_TEMPLATE, headers=headers, p=view)


class UsagePages(DashboardController):
    @get("/usage")
    async def usage_page(
        self, web_admin: WebUser, projects_service: ProjectService, period: str = DEFAULT_PERIOD
    ) -> Template:
        if period not in PERIODS:
            period = DEFAULT_PERIOD
        now = utcnow()
        usage = await platform_usage(
            projects_service.repository.session, period_start(period, now), now
        )

        return admin_page(
            "dashboard/usage.html",
            web_admin,
            "usage",
            usage=usage,
            period=period,
            periods=PERIODS,
            daily=columns(
                "chart-daily",
                "Requests per day (UTC)",
                [(t.label, t.requests) for t in usage.by_day],
            ),
            breakdowns=_breakdowns(usage),
        )
