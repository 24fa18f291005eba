"""Project quotas: the admin's ceilings and the owner's own lower limits (one row per
project in ``project_quotas``; no row means no limit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from advanced_alchemy.exceptions import IntegrityError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy.exc import IntegrityError as SQLAlchemyIntegrityError

from app.db.models import ProjectQuota
from app.domain.projects.services import PROJECT_NOT_FOUND
from app.lib.errors import BadRequestError, NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes

# (column of the admin ceiling, column of the owner's limit, wire name)
WINDOW_FIELDS = (
    ("per_minute", "owner_per_minute", "perMinute"),
    ("per_day", "owner_per_day", "perDay"),
    ("per_month", "owner_per_month", "perMonth"),
)


@dataclass(frozen=True, slots=True)
class WindowValues:
    per_minute: int | None
    per_day: int | None
    per_month: int | None

    def get(self, column: str) -> int | None:
        value: int | None = getattr(self, column)
        return value


class ProjectQuotaService(SQLAlchemyAsyncRepositoryService[ProjectQuota]):
    class Repo(SQLAlchemyAsyncRepository[ProjectQuota]):
        model_type = ProjectQuota

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``QuotaSync`` (set by the request's provider): told after every write."""

    async def of_project(self, project_id: UUID) -> ProjectQuota | None:
        return await self.get_one_or_none(ProjectQuota.project_id == project_id)

    async def set_admin_limits(
        self, project_id: UUID, limits: WindowValues, fail_closed: bool | None
    ) -> ProjectQuota:
        """Replace the ceilings (``fail_closed`` ``None``: unchanged). Owner limits
        above a lowered ceiling are kept; the lower of the two applies anyway."""
        values: dict[str, Any] = {column: limits.get(column) for column, _, _ in WINDOW_FIELDS}
        if fail_closed is not None:
            values["fail_closed"] = fail_closed
        return await self._upsert(project_id, values)

    async def set_owner_limits(self, project_id: UUID, limits: WindowValues) -> ProjectQuota:
        """Replace the owner's limits; each must stay within the admin ceiling."""
        row = await self.of_project(project_id)
        for column, _, wire in WINDOW_FIELDS:
            ceiling = None if row is None else getattr(row, column)
            wanted = limits.get(column)
            if ceiling is not None and wanted is not None and wanted > ceiling:
                raise BadRequestError(
                    f"`{wire}` ({wanted}) is above the limit the platform admin set "
                    f"({ceiling}); an owner may only lower it",
                    code="above_admin_limit",
                    param=wire,
                )
        values = {owner: limits.get(column) for column, owner, _ in WINDOW_FIELDS}
        return await self._upsert(project_id, values)

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
