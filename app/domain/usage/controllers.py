"""Usage API: a project's usage records.

- ``GET /api/projects/{projectId}/usage`` and ``.../usage/summary`` (members, API
  keys, admins): usage records, filtered and paginated, and their aggregates.

A project the caller cannot see is a 404 ``project_not_found``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Controller, Request, get

from app.db.models import UsageRecord
from app.domain.paging import DEFAULT_LIMIT, LimitQuery, OffsetQuery, Page, page_of
from app.domain.projects.deps import projects_principal
from app.domain.projects.services import ProjectAccess
from app.domain.usage.schemas import (
    UsageGroupOut,
    UsageRecordOut,
    UsageSummaryOut,
    UsageTotals,
)
from app.domain.usage.services import (
    Aggregate,
    UsageFilters,
    UsageRecordService,
    parse_group_by,
)

PAGE_PARAMS = frozenset({"limit", "offset"})
SUMMARY_PARAMS = frozenset({"groupBy"})


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


class ProjectUsageController(Controller):
    path = "/api/projects/{project_id:uuid}"
    tags = ["projects"]
    dependencies = {"principal": projects_principal}

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
