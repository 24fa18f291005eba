"""Project quotas: the admin's ceilings and the owner's own lower limits (one row per
project in ``project_quotas``; no row means no limit)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from advanced_alchemy.exceptions import IntegrityError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy.exc import IntegrityError as SQLAlchemyIntegrityError

from app.db.models import ProjectQuota
from app.domain.projects.services import PROJECT_NOT_FOUND
from app.domain.quotas.fields import LimitErrors, LimitProblem, QuotaValues, above_ceilings
from app.lib.errors import NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes


class ProjectQuotaService(SQLAlchemyAsyncRepositoryService[ProjectQuota]):
    class Repo(SQLAlchemyAsyncRepository[ProjectQuota]):
        model_type = ProjectQuota

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``QuotaSync`` (set by the request's provider): told after every write."""

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
        row = await self._write(project_id, values)
        await self.changes.changed(project_id)
        return row

    async def _write(self, project_id: UUID, values: dict[str, Any]) -> ProjectQuota:
        session = self.repository.session
        row = await self.of_project(project_id)
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
