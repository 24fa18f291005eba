"""Quota and usage APIs.

- ``PUT /api/admin/projects/{projectId}/quota`` (platform admin): the ceilings and
  the fail policy.
- ``GET /api/projects/{projectId}/quota`` (members, API keys, admins): limits, both
  sides of them, and the current windows' consumption from the state store.
- ``PUT /api/projects/{projectId}/quota`` (owners, admins): the owner's lower limits.
- ``GET /api/projects/{projectId}/usage`` and ``.../usage/summary`` (members, API
  keys, admins): usage records, filtered and paginated, and their aggregates.

A project the caller cannot see is a 404 ``project_not_found``. A quota change takes
effect at once on this replica and, through ``QuotaSync``, on every other one.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Controller, Request, get, put

from app.db.models import Project, ProjectQuota, UsageRecord
from app.domain.accounts.principals import Principal
from app.domain.backends.deps import platform_admin
from app.domain.paging import LimitQuery, OffsetQuery, page_of
from app.domain.projects.deps import projects_principal
from app.domain.projects.services import PROJECT_NOT_FOUND, ProjectAccess, ProjectService
from app.domain.quotas.gate import QuotaGate, WindowUsage
from app.domain.quotas.limits import QuotaLimits, QuotaSync
from app.domain.quotas.schemas import (
    AdminQuotaIn,
    LimitsOut,
    OwnerQuotaIn,
    QuotaOut,
    QuotaUsageOut,
    UsageGroupOut,
    UsageRecordOut,
    UsageSummaryOut,
    UsageTotals,
    WindowUsageOut,
)
from app.domain.quotas.services import ProjectQuotaService, WindowValues
from app.domain.quotas.usage_queries import (
    Aggregate,
    UsageFilters,
    UsageRecordService,
    parse_group_by,
)
from app.lib.errors import NotFoundError
from app.lib.pagination import DEFAULT_LIMIT, Page

PAGE_PARAMS = frozenset({"limit", "offset"})
SUMMARY_PARAMS = frozenset({"groupBy"})


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


def _query(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {name: request.query_params[name] for name in request.query_params}


def record_out(r: UsageRecord) -> UsageRecordOut:
    return UsageRecordOut(
        id=r.id,
        api_key_id=r.api_key_id,
        user_id=r.user_id,
        model_requested=r.model_requested,
        model_served=r.model_served,
        backend=r.backend,
        endpoint=r.endpoint,
        streamed=r.streamed,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        total_tokens=r.total_tokens,
        estimated=r.estimated,
        status=r.status,
        error_code=r.error_code,
        latency_ms=r.latency_ms,
        ttft_ms=r.ttft_ms,
        conversation_id=r.conversation_id,
        model_profile_id=r.model_profile_id,
        is_custom=r.is_custom,
        is_override_key=r.is_override_key,
        cost=r.cost,
        created_at=r.created_at,
    )


def _group_out(a: Aggregate) -> UsageGroupOut:
    return UsageGroupOut(
        key=a.key,
        requests=a.requests,
        prompt_tokens=a.prompt_tokens,
        completion_tokens=a.completion_tokens,
        total_tokens=a.total_tokens,
        errors=a.errors,
        cost=a.cost,
    )


class QuotaAdminController(Controller):
    path = "/api/admin/projects"
    tags = ["admin: quotas"]
    dependencies = {"platform_admin": platform_admin}

    @put("/{project_id:uuid}/quota")
    async def set_admin_quota(
        self,
        project_id: UUID,
        data: AdminQuotaIn,
        platform_admin: Principal,
        projects_service: ProjectService,
        project_quotas_service: ProjectQuotaService,
        quota_sync: QuotaSync,
        quota_gate: QuotaGate,
    ) -> QuotaOut:
        if await projects_service.get_one_or_none(Project.id == project_id) is None:
            raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")
        row = await project_quotas_service.set_admin_limits(
            project_id,
            WindowValues(data.per_minute, data.per_day, data.per_month),
            fail_closed=data.fail_closed if isinstance(data.fail_closed, bool) else None,
        )
        await quota_sync.project_changed(project_id)
        return await quota_out(project_id, row, quota_gate)


class ProjectQuotaController(Controller):
    path = "/api/projects/{project_id:uuid}"
    tags = ["projects"]
    dependencies = {"principal": projects_principal}

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
        quota_sync: QuotaSync,
        quota_gate: QuotaGate,
    ) -> QuotaOut:
        access.require(access.can_manage_project, "change the project's quota")
        row = await project_quotas_service.set_owner_limits(
            project_id, WindowValues(data.per_minute, data.per_day, data.per_month)
        )
        await quota_sync.project_changed(project_id)
        return await quota_out(project_id, row, quota_gate)

    @get("/usage")
    async def list_usage(
        self,
        request: Request[Any, Any, Any],
        project_id: UUID,
        access: ProjectAccess,
        usage_records_service: UsageRecordService,
        limit: LimitQuery = DEFAULT_LIMIT,
        offset: OffsetQuery = 0,
    ) -> Page[UsageRecordOut]:
        filters = UsageFilters.parse(_query(request), allowed=PAGE_PARAMS)
        rows, total = await usage_records_service.page(project_id, filters, limit, offset)
        return page_of(rows, total, limit, offset, record_out)

    @get("/usage/summary")
    async def usage_summary(
        self,
        request: Request[Any, Any, Any],
        project_id: UUID,
        access: ProjectAccess,
        usage_records_service: UsageRecordService,
    ) -> UsageSummaryOut:
        query = _query(request)
        group_by = parse_group_by(query.get("groupBy"))
        filters = UsageFilters.parse(query, allowed=SUMMARY_PARAMS)
        groups, totals = await usage_records_service.summary(project_id, filters, group_by)
        return UsageSummaryOut(
            group_by=group_by,
            items=[_group_out(g) for g in groups],
            totals=UsageTotals(
                requests=totals.requests,
                prompt_tokens=totals.prompt_tokens,
                completion_tokens=totals.completion_tokens,
                total_tokens=totals.total_tokens,
                errors=totals.errors,
                cost=totals.cost,
            ),
        )
