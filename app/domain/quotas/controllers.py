"""Quota APIs.

- ``PUT /api/admin/projects/{projectId}/quota`` (platform admin): the ceilings and
  the fail policy.
- ``GET /api/projects/{projectId}/quota`` (members, API keys, admins): limits, both
  sides of them, and the current windows' consumption from the state store.
- ``PUT /api/projects/{projectId}/quota`` (owners, admins): the owner's lower limits.

The usage records endpoints are in ``app.domain.usage.controllers``.

A project the caller cannot see is a 404 ``project_not_found``. A quota change takes
effect at once on this replica and, through ``QuotaSync``, on every other one.
"""

from __future__ import annotations

from uuid import UUID

from litestar import get, put

from app.db.models import Project, ProjectQuota
from app.domain.accounts.principals import Principal
from app.domain.projects.services import PROJECT_NOT_FOUND, ProjectAccess, ProjectService
from app.domain.quotas.gate import QuotaGate, WindowUsage
from app.domain.quotas.limits import QuotaLimits
from app.domain.quotas.schemas import (
    AdminQuotaIn,
    LimitsOut,
    OwnerQuotaIn,
    QuotaOut,
    QuotaUsageOut,
    WindowUsageOut,
)
from app.domain.quotas.services import ProjectQuotaService, WindowValues
from app.domain.rest import AdminController, ProjectApiController
from app.lib.errors import NotFoundError


def _window_out(usage: WindowUsage) -> WindowUsageOut:
    return WindowUsageOut(used=usage.used, limit=usage.limit, resets_at=usage.resets_at)


async def quota_out(project_id: UUID, row: ProjectQuota | None, gate: QuotaGate) -> QuotaOut:
    limits = QuotaLimits.of(row)
    usage = await gate.usage(project_id, limits)
    return QuotaOut(
        limits=LimitsOut(limits.per_minute, limits.per_day, limits.per_month),
        admin_limits=LimitsOut(
            *((None, None, None) if row is None else (row.per_minute, row.per_day, row.per_month))
        ),
        owner_limits=LimitsOut(
            *(
                (None, None, None)
                if row is None
                else (row.owner_per_minute, row.owner_per_day, row.owner_per_month)
            )
        ),
        fail_closed=limits.fail_closed,
        usage=QuotaUsageOut(
            minute=_window_out(usage["minute"]),
            day=_window_out(usage["day"]),
            month=_window_out(usage["month"]),
        ),
    )


class QuotaAdminController(AdminController):
    path = "/api/admin/projects"
    tags = ["admin: quotas"]

    @put("/{project_id:uuid}/quota")
    async def set_admin_quota(
        self,
        project_id: UUID,
        data: AdminQuotaIn,
        platform_admin: Principal,
        projects_service: ProjectService,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
    ) -> QuotaOut:
        if await projects_service.get_one_or_none(Project.id == project_id) is None:
            raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")
        row = await project_quotas_service.set_admin_limits(
            project_id,
            WindowValues(data.per_minute, data.per_day, data.per_month),
            fail_closed=data.fail_closed if isinstance(data.fail_closed, bool) else None,
        )
        return await quota_out(project_id, row, quota_gate)


class ProjectQuotaController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}"

    @get("/quota")
    async def get_quota(
        self,
        project_id: UUID,
        access: ProjectAccess,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
    ) -> QuotaOut:
        row = await project_quotas_service.of_project(project_id)
        return await quota_out(project_id, row, quota_gate)

    @put("/quota")
    async def set_owner_quota(
        self,
        project_id: UUID,
        access: ProjectAccess,
        data: OwnerQuotaIn,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
    ) -> QuotaOut:
        access.require(access.can_manage_project, "change the project's quota")
        row = await project_quotas_service.set_owner_limits(
            project_id, WindowValues(data.per_minute, data.per_day, data.per_month)
        )
        return await quota_out(project_id, row, quota_gate)
