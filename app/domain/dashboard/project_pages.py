"""The projects-and-quotas page (every project, its limits, editable, and what it has
used) and the usage page (platform totals by project, model, backend and day)."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import QueryParameter
from litestar.response import Template

from app.db.models import Project, ProjectQuota
from app.domain.dashboard.charts import bar_rows, columns
from app.domain.dashboard.common import (
    admin_page,
    checked,
    form_status,
    fragment,
    notify,
    optional_int,
    validation_field,
)
from app.domain.dashboard.usage import (
    DEFAULT_PERIOD,
    PERIODS,
    Totals,
    period_start,
    platform_usage,
    project_totals,
)
from app.domain.projects.services import PROJECT_NOT_FOUND, ProjectService
from app.domain.quotas.controllers import quota_out
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.schemas import AdminQuotaIn, QuotaOut
from app.domain.quotas.services import ProjectQuotaService, WindowValues
from app.domain.web.pages import WebUser, csrf_guard
from app.lib.clock import utcnow
from app.lib.errors import NotFoundError

PAGE_SIZE = 50
ROW_TEMPLATE = "dashboard/partials/project_row.html"
FIELDS = {"perMinute": "per_minute", "perDay": "per_day", "perMonth": "per_month"}
PageQuery = Annotated[int, QueryParameter(ge=1, le=100_000)]


@dataclass(frozen=True, slots=True)
class ProjectView:
    project: Project
    owner_email: str
    quota: QuotaOut
    month: Totals | None
    """Usage records since the start of the month (UTC)."""


def _month_start(now: datetime.datetime) -> datetime.datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


async def _views(
    projects: list[Project],
    projects_service: ProjectService,
    quotas_service: ProjectQuotaService,
    gate: QuotaGate,
) -> list[ProjectView]:
    session = projects_service.repository.session
    ids = [p.id for p in projects]
    emails = await projects_service.owner_emails(projects)
    quota_rows = (
        {q.project_id: q for q in await quotas_service.get_many(ProjectQuota.project_id.in_(ids))}
        if ids
        else {}
    )
    month = await project_totals(session, ids, _month_start(utcnow()))
    quotas = await asyncio.gather(*(quota_out(pid, quota_rows.get(pid), gate) for pid in ids))
    return [
        ProjectView(p, emails.get(p.owner_id, ""), quota, month.get(p.id))
        for p, quota in zip(projects, quotas, strict=True)
    ]


async def _project(projects_service: ProjectService, project_id: UUID) -> Project:
    project = await projects_service.get_one_or_none(Project.id == project_id)
    if project is None:
        raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")
    return project


class ProjectQuotaPages(Controller):
    path = "/admin"
    include_in_schema = False
    guards = [csrf_guard]

    @get("/projects")
    async def projects_page(
        self,
        web_admin: WebUser,
        projects_service: ProjectService,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
        page: PageQuery = 1,
    ) -> Template:
        listed, total = await projects_service.visible_page(
            web_admin.principal, PAGE_SIZE, (page - 1) * PAGE_SIZE
        )
        projects = [project for project, _ in listed]
        views = await _views(projects, projects_service, project_quotas_service, quota_gate)
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
    async def project_row(
        self,
        project_id: UUID,
        web_admin: WebUser,
        projects_service: ProjectService,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
    ) -> Template:
        project = await _project(projects_service, project_id)
        [view] = await _views([project], projects_service, project_quotas_service, quota_gate)
        return fragment(ROW_TEMPLATE, web_admin, p=view)

    @get("/projects/{project_id:uuid}/quota")
    async def quota_form(
        self,
        project_id: UUID,
        web_admin: WebUser,
        projects_service: ProjectService,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
    ) -> Template:
        project = await _project(projects_service, project_id)
        [view] = await _views([project], projects_service, project_quotas_service, quota_gate)
        limits = view.quota.admin_limits
        values = {
            "per_minute": "" if limits.per_minute is None else str(limits.per_minute),
            "per_day": "" if limits.per_day is None else str(limits.per_day),
            "per_month": "" if limits.per_month is None else str(limits.per_month),
            "fail_closed": view.quota.fail_closed,
        }
        return fragment(
            "dashboard/partials/quota_form.html", web_admin, p=view, values=values, errors={}
        )

    @post("/projects/{project_id:uuid}/quota", status_code=200)
    async def set_quota(
        self,
        project_id: UUID,
        request: Request[Any, Any, Any],
        web_admin: WebUser,
        projects_service: ProjectService,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
    ) -> Template:
        project = await _project(projects_service, project_id)
        form = await request.form()
        body = {wire: optional_int(form, field) for wire, field in FIELDS.items()}
        values: dict[str, Any] = {field: str(form.get(field) or "") for field in FIELDS.values()}
        values["fail_closed"] = checked(form, "fail_closed")
        try:
            data = msgspec.convert({**body, "failClosed": values["fail_closed"]}, AdminQuotaIn)
        except msgspec.ValidationError as exc:
            field, message = validation_field(exc, FIELDS)
            errors = {field: f"{message} Leave it blank for no limit."}
            [view] = await _views([project], projects_service, project_quotas_service, quota_gate)
            return fragment(
                "dashboard/partials/quota_form.html",
                web_admin,
                status_code=form_status(request, errors),
                p=view,
                values=values,
                errors=errors,
            )
        await project_quotas_service.set_admin_limits(
            project_id,
            WindowValues(data.per_minute, data.per_day, data.per_month),
            fail_closed=values["fail_closed"],
        )
        [view] = await _views([project], projects_service, project_quotas_service, quota_gate)
        return fragment(
            ROW_TEMPLATE, web_admin, headers=notify(f"Limits of {project.name} saved."), p=view
        )


class UsagePages(Controller):
    path = "/admin"
    include_in_schema = False
    guards = [csrf_guard]

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

        def chart(chart_id: str, title: str, rows: list[Totals]) -> Any:
            return bar_rows(chart_id, title, [(t.label, t.requests) for t in rows])

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
            project_chart=chart("chart-projects", "Requests by project", usage.by_project),
            model_chart=chart("chart-models", "Requests by model", usage.by_model),
            backend_chart=chart("chart-backends", "Requests by backend", usage.by_backend),
        )
