"""Usage API: a project's usage records.

- ``GET /api/projects/{projectId}/usage`` and ``.../usage/summary`` (members, API
  keys, admins): usage records, filtered and paginated, and their aggregates.
- ``GET .../usage.csv`` and ``.../usage/summary.csv``: the same as CSV (all matching
  records, up to ``MAX_EXPORT_ROWS``; the summary's groups and a ``(total)`` line).
- ``GET /api/admin/usage/projects`` (platform admins): spend per project over the
  platform, with the same filters, paged.

A project the caller cannot see is a 404 ``project_not_found``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request, Response, get

from app.domain.accounts.principals import Principal
from app.domain.paging import Page, Paging, from_row
from app.domain.projects.services import ProjectAccess
from app.domain.rest import AdminController, ProjectApiController
from app.domain.usage.export import MAX_EXPORT_ROWS, records_csv, summary_csv
from app.domain.usage.schemas import (
    ProjectSpendOut,
    UsageRecordOut,
    UsageSummaryOut,
    UsageTotals,
)
from app.domain.usage.services import (
    UsageFilters,
    UsageRecordService,
    parse_group_by,
)
from app.domain.usage.spend import project_spend

PAGE_PARAMS = frozenset({"limit", "offset"})
SUMMARY_PARAMS = frozenset({"groupBy"})
CSV = "text/csv; charset=utf-8"


def _query(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {name: request.query_params[name] for name in request.query_params}


# Every field of these is the record's (or aggregate's) attribute of the same name;
# the groups are ``UsageGroupOut`` already.
record_out = from_row(UsageRecordOut)
_totals_out = from_row(UsageTotals)


class ProjectUsageController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}"

    @get("/usage")
    async def list_usage(
        self,
        request: Request[Any, Any, Any],
        project_id: UUID,
        access: ProjectAccess,
        usage_records_service: UsageRecordService,
        paging: Paging,
    ) -> Page[UsageRecordOut]:
        filters = UsageFilters.parse(_query(request), allowed=PAGE_PARAMS)
        rows, total = await usage_records_service.page(
            project_id, filters, paging.limit, paging.offset
        )
        return paging.page(rows, total, record_out)

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
            items=groups,
            totals=_totals_out(totals),
        )

    @get("/usage.csv", media_type=CSV)
    async def export_usage(
        self,
        request: Request[Any, Any, Any],
        project_id: UUID,
        access: ProjectAccess,
        usage_records_service: UsageRecordService,
    ) -> Response[bytes]:
        filters = UsageFilters.parse(_query(request), allowed=frozenset())
        rows = await usage_records_service.export(project_id, filters, MAX_EXPORT_ROWS)
        return _download(records_csv(rows), "usage.csv")

    @get("/usage/summary.csv", media_type=CSV)
    async def export_usage_summary(
        self,
        request: Request[Any, Any, Any],
        project_id: UUID,
        access: ProjectAccess,
        usage_records_service: UsageRecordService,
    ) -> Response[bytes]:
        query = _query(request)
        group_by = parse_group_by(query.get("groupBy"))
        filters = UsageFilters.parse(query, allowed=SUMMARY_PARAMS)
        groups, totals = await usage_records_service.summary(project_id, filters, group_by)
        return _download(summary_csv(groups, totals), f"usage-by-{group_by}.csv")


class AdminUsageController(AdminController):
    path = "/api/admin/usage"
    tags = ["admin: usage"]

    @get("/projects")
    async def project_spend(
        self,
        request: Request[Any, Any, Any],
        platform_admin: Principal,
        usage_records_service: UsageRecordService,
        paging: Paging,
    ) -> Page[ProjectSpendOut]:
        filters = UsageFilters.parse(_query(request), allowed=PAGE_PARAMS)
        items, total = await project_spend(
            usage_records_service.repository.session, filters, paging.limit, paging.offset
        )
        return Page(items=items, total=total, limit=paging.limit, offset=paging.offset)


def _download(body: bytes, filename: str) -> Response[bytes]:
    return Response(
        body,
        media_type=CSV,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
