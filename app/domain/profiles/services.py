"""Stored model profiles and each project's choice among them: the database side of
the routing ``ProfileTable`` and of the runtime catalog.

Profiles name each other by plain id (a fallback, a failover chain) and projects name
them in their settings; the database has no foreign keys for these, so the rules live
here:

- a write that names other profiles locks them (``FOR SHARE`` on PostgreSQL) and
  refuses ids that do not exist;
- deleting a profile locks it first (``FOR UPDATE``), refuses with 409
  ``profile_in_use`` while another profile names it as fallback or in its chain, and
  removes it from every project's settings in the same transaction (a project whose
  default it was falls back to the first enabled profile; a project whose explicit
  enabled list named it loses it from that list, possibly ending with none enabled).

The locks make a reference check and a concurrent delete serialise on PostgreSQL;
SQLite runs one writer at a time anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol
from uuid import UUID, uuid4

import msgspec
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import Text, cast, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ModelProfile, ProjectProfileSettings
from app.domain.paging import ascending
from app.domain.profiles.catalog import ProjectModels
from app.domain.profiles.schemas import (
    ProfileCreate,
    ProfileUpdate,
    ProjectModelsIn,
    check_profile_id,
    normalize_tags,
    unique_ids,
)
from app.domain.races import commit_raced, retry_raced
from app.domain.records import copied
from app.lib.errors import BadRequestError, ConflictError, NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes
from app.routing.profiles import Profile
from app.routing.types import SCORE_KINDS, ScoreKind


def to_profile(row: ModelProfile) -> Profile:
    """The routing view of a stored profile."""
    return copied(
        Profile,
        row,
        tags=frozenset(row.tags or ()),
        failover_chain=tuple(row.failover_chain or ()),
        routing_score=score_kind(row.routing_score),
    )


def stored_values(data: ProfileCreate | ProfileUpdate) -> dict[str, Any]:
    """The fields the body gives, as stored: names trimmed, tags normalized, the
    chain checked (400 naming ``failoverChain``)."""
    values = {k: v for k, v in msgspec.structs.asdict(data).items() if v is not msgspec.UNSET}
    for name in ("name", "base_model"):
        if name in values:
            values[name] = values[name].strip()
    if "tags" in values:
        values["tags"] = normalize_tags(values["tags"])
    if "failover_chain" in values:
        values["failover_chain"] = unique_ids(values["failover_chain"], "failoverChain")
    return values


def score_kind(value: str | None) -> ScoreKind | None:
    """A stored routing score; anything the API would not have written reads as None
    (the platform default)."""
    for kind in SCORE_KINDS:
        if value == kind:
            return kind
    return None


def profile_not_found(profile_id: str) -> NotFoundError:
    return NotFoundError(f"no model profile {profile_id!r} exists", code="profile_not_found")


def _unknown(profile_id: str, param: str) -> BadRequestError:
    return BadRequestError(
        f"no model profile {profile_id!r} exists", code="unknown_profile", param=param
    )


def _like_json_string(value: str) -> str:
    """A LIKE pattern matching ``value`` as a JSON string anywhere in a JSON text."""
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f'%"{escaped}"%'


class ProfileChanges(Protocol):
    """``ProfileSync``: re-reads a profile here and tells the other replicas."""

    async def profile_changed(self, profile_id: str) -> None: ...


class ModelProfileService(SQLAlchemyAsyncRepositoryService[ModelProfile]):
    class Repo(SQLAlchemyAsyncRepository[ModelProfile]):
        model_type = ModelProfile

    repository_type = Repo
    changes: ProfileChanges | None = None
    """``ProfileSync`` (set by the request's provider): told after every write."""

    async def page(self, limit: int, offset: int) -> tuple[Sequence[ModelProfile], int]:
        return await self.get_many_and_count(*ascending("id", limit, offset))

    async def require(self, profile_id: str) -> ModelProfile:
        row = await self.get_one_or_none(ModelProfile.id == profile_id)
        if row is None:
            raise profile_not_found(profile_id)
        return row

    async def create_profile(self, data: ProfileCreate) -> ModelProfile:
        profile_id = check_profile_id(data.id, "id")
        values = stored_values(data)
        if await self.exists(ModelProfile.id == profile_id):
            raise _exists(profile_id)
        await self._check_references(profile_id, data.fallback_profile_id, values["failover_chain"])
        row = ModelProfile(**values)
        raced = await commit_raced(self.repository.session, row)
        if raced is not None:  # created concurrently between the check and the insert
            raise _exists(profile_id) from raced
        await self._changed(profile_id)
        return row

    async def update_profile(self, profile_id: str, data: ProfileUpdate) -> ModelProfile:
        row = await self._locked(profile_id)
        values = stored_values(data)
        await self._check_references(
            profile_id, values.get("fallback_profile_id"), values.get("failover_chain", [])
        )
        for name, value in values.items():
            setattr(row, name, value)
        await self.repository.session.commit()
        await self._changed(profile_id)
        return row

    async def delete_profile(self, profile_id: str) -> list[UUID]:
        """Delete a profile no other profile names; returns the projects whose
        settings were cleaned up in the same transaction."""
        session = self.repository.session
        row = await self._locked(profile_id)
        users = await session.execute(
            select(ModelProfile.id, ModelProfile.fallback_profile_id, ModelProfile.failover_chain)
            .where(ModelProfile.id != profile_id)
            .order_by(ModelProfile.id)
        )
        naming = [
            other
            for other, fallback, chain in users
            if fallback == profile_id or profile_id in (chain or ())
        ]
        if naming:
            raise ConflictError(
                f"model profile {profile_id!r} is the fallback or in the failover chain of "
                f"{', '.join(repr(n) for n in naming)}; change those profiles first",
                code="profile_in_use",
            )
        settings = await session.scalars(
            select(ProjectProfileSettings).where(
                or_(
                    ProjectProfileSettings.default_profile_id == profile_id,
                    cast(ProjectProfileSettings.enabled_profile_ids, Text).like(
                        _like_json_string(profile_id), escape="\\"
                    ),
                )
            )
        )
        affected: list[UUID] = []
        for project in settings:
            changed = False
            if project.default_profile_id == profile_id:
                project.default_profile_id = None
                changed = True
            enabled = project.enabled_profile_ids
            if enabled is not None and profile_id in enabled:
                project.enabled_profile_ids = [p for p in enabled if p != profile_id]
                changed = True
            if changed:
                affected.append(project.project_id)
        await session.delete(row)
        await session.commit()
        # Cleaned-up projects need no events of their own: a profile that is gone
        # drops every cached project entry on each replica (see ProfileSync).
        await self._changed(profile_id)
        return affected

    async def _changed(self, profile_id: str) -> None:
        if self.changes is not None:
            await self.changes.profile_changed(profile_id)

    async def _locked(self, profile_id: str) -> ModelProfile:
        """The row, locked against concurrent writers until the commit."""
        row: ModelProfile | None = await self.repository.session.scalar(
            select(ModelProfile).where(ModelProfile.id == profile_id).with_for_update()
        )
        if row is None:
            raise profile_not_found(profile_id)
        return row

    async def _check_references(
        self, profile_id: str, fallback: str | None, chain: list[str]
    ) -> None:
        if fallback is not None:
            check_profile_id(fallback, "fallbackProfileId")
            if fallback == profile_id:
                raise _self_reference("fallbackProfileId")
        if profile_id in chain:
            raise _self_reference("failoverChain")
        wanted = ([] if fallback is None else [fallback]) + chain
        found = set(await existing_profiles(self.repository.session, wanted))
        if fallback is not None and fallback not in found:
            raise _unknown(fallback, "fallbackProfileId")
        for member in chain:
            if member not in found:
                raise _unknown(member, "failoverChain")


async def existing_profiles(session: AsyncSession, ids: Iterable[str]) -> dict[str, bool]:
    """``{id: globally enabled}`` for those of ``ids`` that exist, share-locked so a
    concurrent delete waits for this transaction."""
    wanted = set(ids)
    if not wanted:
        return {}
    rows = await session.execute(
        select(ModelProfile.id, ModelProfile.enabled)
        .where(ModelProfile.id.in_(wanted))
        .with_for_update(read=True)
    )
    return {profile_id: bool(enabled) for profile_id, enabled in rows}


def _exists(profile_id: str) -> ConflictError:
    return ConflictError(
        f"a model profile {profile_id!r} already exists", code="profile_exists", param="id"
    )


def _self_reference(param: str) -> BadRequestError:
    return BadRequestError("a profile cannot name itself", code="self_reference", param=param)


class ProjectModelsService(SQLAlchemyAsyncRepositoryService[ProjectProfileSettings]):
    """A project's default profile and enabled set (no row: every enabled profile)."""

    class Repo(SQLAlchemyAsyncRepository[ProjectProfileSettings]):
        model_type = ProjectProfileSettings

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``ProfileSync`` (set by the request's provider): told after every write."""

    async def for_project(self, project_id: UUID) -> ProjectModels:
        row = await self.get_one_or_none(ProjectProfileSettings.project_id == project_id)
        return project_models(row)

    async def put(self, project_id: UUID, data: ProjectModelsIn) -> ProjectModels:
        default = data.default_profile_id
        enabled = None
        if data.enabled_profile_ids is not None:
            enabled = sorted(set(data.enabled_profile_ids))
            for value in enabled:
                check_profile_id(value, "enabledProfileIds")
        if default is not None:
            check_profile_id(default, "defaultProfileId")
        known = await existing_profiles(
            self.repository.session, [*(enabled or ()), *([default] if default else [])]
        )
        for value in enabled or ():
            if value not in known:
                raise _unknown(value, "enabledProfileIds")
        if default is not None:
            if default not in known:
                raise _unknown(default, "defaultProfileId")
            if enabled is not None and default not in enabled:
                raise _default_not_enabled(default, "is not in enabledProfileIds")
            if not known[default]:
                raise _default_not_enabled(default, "is disabled on the platform")
        # The first settings of this project can be written twice at once.
        await retry_raced(
            self.repository.session, lambda: self._upsert(project_id, default, enabled)
        )
        await self.changes.changed(project_id)
        return ProjectModels(
            default_profile_id=default,
            enabled_profile_ids=None if enabled is None else frozenset(enabled),
        )

    async def _upsert(
        self, project_id: UUID, default: str | None, enabled: list[str] | None
    ) -> None:
        session = self.repository.session
        row = await session.scalar(
            select(ProjectProfileSettings)
            .where(ProjectProfileSettings.project_id == project_id)
            .with_for_update()
        )
        if row is None:
            row = ProjectProfileSettings(id=uuid4(), project_id=project_id)
            session.add(row)
        row.default_profile_id = default
        row.enabled_profile_ids = enabled
        await session.commit()


def _default_not_enabled(profile_id: str, why: str) -> BadRequestError:
    return BadRequestError(
        f"the default profile {profile_id!r} {why}; a default must be enabled for the project",
        code="default_not_enabled",
        param="defaultProfileId",
    )


def project_models(row: ProjectProfileSettings | None) -> ProjectModels:
    if row is None:
        return ProjectModels()
    enabled = row.enabled_profile_ids
    return ProjectModels(
        default_profile_id=row.default_profile_id,
        enabled_profile_ids=None if enabled is None else frozenset(enabled),
    )


async def load_profiles(db_config: SQLAlchemyAsyncConfig) -> list[Profile]:
    async with db_config.get_session() as session:
        return [to_profile(row) for row in await session.scalars(select(ModelProfile))]


async def load_profile(db_config: SQLAlchemyAsyncConfig, profile_id: str) -> Profile | None:
    async with db_config.get_session() as session:
        row = await session.get(ModelProfile, profile_id)
        return None if row is None else to_profile(row)


async def load_project_models(db_config: SQLAlchemyAsyncConfig, project_id: UUID) -> ProjectModels:
    async with db_config.get_session() as session:
        row = await session.scalar(
            select(ProjectProfileSettings).where(ProjectProfileSettings.project_id == project_id)
        )
        return project_models(row)
