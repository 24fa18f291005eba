"""Usage API: a project's usage records.

- ``GET /api/projects/{projectId}/usage`` and ``.../usage/summary`` (members, API
  keys, admins): usage records, filtered and paginated, and their aggregates.

A project the caller cannot see is a 404 ``project_not_found``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request, get

from app.domain.paging import Page, Paging, from_row
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.domain.usage.schemas import (
    UsageRecordOut,
    UsageSummaryOut,
    UsageTotals,
)
from app.domain.usage.services import (
    UsageFilters,
    UsageRecordService,
    parse_group_by,
)

PAGE_PARAMS = frozenset({"limit", "offset"})
SUMMARY_PARAMS = frozenset({"groupBy"})


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
