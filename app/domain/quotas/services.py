"""Project quotas: the admin's ceilings and the owner's own lower limits (one row per
project in ``project_quotas``; no row means no limit)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import Any, Protocol
from uuid import UUID

from advanced_alchemy.exceptions import IntegrityError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import case, func, or_, select
from sqlalchemy.exc import IntegrityError as SQLAlchemyIntegrityError

from app.db.models import ProjectQuota, UsageRecord
from app.domain.projects.services import PROJECT_NOT_FOUND
from app.domain.quotas.errors import Metric, WindowName
from app.domain.quotas.fields import LimitErrors, LimitProblem, QuotaValues, above_ceilings
from app.domain.quotas.limits import QuotaLimits
from app.domain.quotas.seeding import ADMISSION_REFUSALS, Counted, newly_counted
from app.domain.quotas.windows import bucket_starts
from app.lib.errors import NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes


class WindowSeeder(Protocol):
    """The gate's side of seeding (``QuotaGate.seed``)."""

    async def seed(
        self,
        project_id: UUID,
        limits: QuotaLimits,
        windows: Counted,
        used: Mapping[tuple[Metric, WindowName], int],
    ) -> None: ...


Usage = dict[tuple[Metric, WindowName], int]


class ProjectQuotaService(SQLAlchemyAsyncRepositoryService[ProjectQuota]):
    class Repo(SQLAlchemyAsyncRepository[ProjectQuota]):
        model_type = ProjectQuota

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``QuotaSync`` (set by the request's provider): told after every write."""
    windows: WindowSeeder | None = None
    """The quota gate (set by the request's provider): seeds the windows a write
    starts counting (``app.domain.quotas.seeding``); ``None`` outside a request."""

    async def of_project(self, project_id: UUID) -> ProjectQuota | None:
        return await self.get_one_or_none(ProjectQuota.project_id == project_id)

    async def set_admin_limits(
        self, project_id: UUID, limits: QuotaValues, fail_closed: bool | None
    ) -> ProjectQuota:
        """Replace the ceilings, every one of them (``fail_closed`` ``None``:
        unchanged). Owner limits above a lowered ceiling are kept; the lower of the two
        applies anyway."""
        values: dict[str, Any] = limits.columns(owner=False)
        if fail_closed is not None:
            values["fail_closed"] = fail_closed
        return await self._upsert(project_id, values)

    async def above_admin(self, project_id: UUID, limits: QuotaValues) -> dict[str, LimitProblem]:
        """The owner's ``limits`` that exceed the admin's ceilings, by wire name."""
        row = await self.of_project(project_id)
        return above_ceilings(QuotaValues.of_row(row, owner=False), limits)

    async def set_owner_limits(self, project_id: UUID, limits: QuotaValues) -> ProjectQuota:
        """Replace the owner's limits; each must stay within the admin ceiling (else
        400 ``above_admin_limit`` naming the first field, nothing written)."""
        problems = await self.above_admin(project_id, limits)
        if problems:
            raise LimitErrors(problems)
        return await self._upsert(project_id, limits.columns(owner=True))

    async def _upsert(self, project_id: UUID, values: dict[str, Any]) -> ProjectQuota:
        existing = await self.of_project(project_id)
        before = QuotaLimits.of(existing)
        row = await self._write(project_id, values, existing)
        after = QuotaLimits.of(row)
        starting = newly_counted(before, after)
        if starting and self.windows is not None:
            used = await self.used_since(project_id, bucket_starts(time.time()))
            await self.windows.seed(project_id, after, starting, used)
        await self.changes.changed(project_id)
        return row

    async def used_since(
        self, project_id: UUID, starts: Mapping[WindowName, datetime.datetime]
    ) -> Usage:
        """What the project's usage records hold for each bucket since its start:
        calls admitted into its quota (not custom LLM or override-key calls, not
        calls refused at admission), their tokens and their cost in micro-units."""
        admitted = or_(
            UsageRecord.error_code.is_(None), UsageRecord.error_code.not_in(ADMISSION_REFUSALS)
        )
        columns = []
        for start in starts.values():
            inside = UsageRecord.created_at >= start
            columns += [
                func.coalesce(func.sum(case((inside, 1), else_=0)), 0),
                func.coalesce(func.sum(case((inside, UsageRecord.total_tokens), else_=0)), 0),
                func.coalesce(
                    func.sum(case((inside, func.coalesce(UsageRecord.cost_micros, 0)), else_=0)),
                    0,
                ),
            ]
        statement = select(*columns).where(
            UsageRecord.project_id == project_id,
            UsageRecord.is_custom.is_(False),
            UsageRecord.is_override_key.is_(False),
            admitted,
            UsageRecord.created_at >= min(starts.values()),
        )
        row = (await self.repository.session.execute(statement)).one()
        used: Usage = {}
        for i, name in enumerate(starts):
            used[("requests", name)] = int(row[3 * i])
            used[("tokens", name)] = int(row[3 * i + 1])
            used[("cost", name)] = int(row[3 * i + 2])
        return used

    async def _write(
        self, project_id: UUID, values: dict[str, Any], row: ProjectQuota | None
    ) -> ProjectQuota:
        session = self.repository.session
        if row is None:
            row = ProjectQuota(project_id=project_id, **{"fail_closed": False, **values})
            try:
                session.add(row)
                await session.commit()
                return row
            except (IntegrityError, SQLAlchemyIntegrityError):
                # Another request created the row first (or the project is gone).
                await session.rollback()
                row = await self.of_project(project_id)
                if row is None:
                    raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found") from None
        for name, value in values.items():
            setattr(row, name, value)
        await session.commit()
        return row
