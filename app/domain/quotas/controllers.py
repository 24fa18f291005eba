"""Quota APIs.

- ``PUT /api/admin/projects/{projectId}/quota`` (platform admin): the ceilings
  (requests, tokens and money per window) and the fail policy.
- ``GET /api/projects/{projectId}/quota`` (members, API keys, admins): limits, both
  sides of them, and the current windows' consumption (requests, tokens, spend) from
  the state store.
- ``PUT /api/projects/{projectId}/quota`` (owners, admins): the owner's lower limits.

The fields are in ``app.domain.quotas.fields``; an invalid one is a 400 naming it,
and nothing is written unless every field is valid.

The usage records endpoints are in ``app.domain.usage.controllers``.

A project the caller cannot see is a 404 ``project_not_found``. A quota change takes
effect at once on this replica and, through ``QuotaSync``, on every other one.
"""

from __future__ import annotations

from uuid import UUID

from litestar import get, put

from app.db.models import Project
from app.domain.accounts.principals import Principal
from app.domain.projects.services import PROJECT_NOT_FOUND, ProjectAccess, ProjectService
from app.domain.quotas.fields import valid_limits
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.schemas import AdminQuotaIn, OwnerQuotaIn, QuotaOut, limits_sent
from app.domain.quotas.services import ProjectQuotaService
from app.domain.quotas.views import quota_out
from app.domain.rest import AdminController, ProjectApiController
from app.lib.errors import NotFoundError


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
        # Every field is checked before anything is looked up or written.
        limits = valid_limits(limits_sent(data))
        if await projects_service.get_one_or_none(Project.id == project_id) is None:
            raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")
        row = await project_quotas_service.set_admin_limits(
            project_id,
            limits,
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
            project_id, valid_limits(limits_sent(data))
        )
        return await quota_out(project_id, row, quota_gate)
