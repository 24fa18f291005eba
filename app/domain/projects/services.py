"""Projects and their members, always filtered by who is asking."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal
from uuid import UUID, uuid4

import msgspec
from advanced_alchemy.exceptions import DuplicateKeyError, IntegrityError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import and_, func, select
from sqlalchemy.exc import IntegrityError as SQLAlchemyIntegrityError

from app.db.models import Project, ProjectMember, User
from app.domain.accounts.principals import (
    AdminTokenPrincipal,
    ApiKeyPrincipal,
    Principal,
    RuntimePrincipal,
    UserPrincipal,
)
from app.domain.accounts.services import normalize_email
from app.domain.projects.schemas import ProjectUpdate
from app.lib.errors import (
    AuthenticationError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
)

AccessRole = Literal["admin", "owner", "member", "api_key"]
PROJECT_NOT_FOUND = "project not found"


def refuse_runtime_tokens(principal: Principal) -> None:
    if isinstance(principal, RuntimePrincipal):
        raise PermissionDeniedError(
            "runtime tokens only reach the runtime API", code="runtime_token_not_allowed"
        )


def _shown_role(is_admin: bool, membership: str | None) -> AccessRole | None:
    """The caller's role: an owner is shown as owner even when also a platform admin
    (it is what creating the project answered); admins rank above plain members."""
    if membership == "owner":
        return "owner"
    if is_admin:
        return "admin"
    if membership == "member":
        return "member"
    return None


@dataclass(frozen=True, slots=True)
class ProjectAccess:
    """What the caller may do in one project.

    Owners and platform admins manage everything; API keys (automation) manage the
    project's credentials but not its settings or members; members read.
    """

    project: Project
    role: AccessRole

    @property
    def can_manage_project(self) -> bool:
        return self.role in ("admin", "owner")

    @property
    def can_manage_credentials(self) -> bool:
        return self.role in ("admin", "owner", "api_key")

    def require(self, allowed: bool, action: str) -> None:
        if not allowed:
            raise PermissionDeniedError(
                f"your role ({self.role}) may not {action}", code="insufficient_role"
            )

    def require_member_removal(self, caller_user_id: UUID | None, user_id: UUID) -> None:
        """A member may leave on their own; removing others needs management rights."""
        leaving_self = caller_user_id is not None and caller_user_id == user_id
        self.require(leaving_self or self.can_manage_project, "manage members")


def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64].strip("-")
    return slug or "project"


class ProjectService(SQLAlchemyAsyncRepositoryService[Project]):
    class Repo(SQLAlchemyAsyncRepository[Project]):
        model_type = Project

    repository_type = Repo

    async def create_owned(self, *, name: str, slug: str | None, owner_id: UUID) -> Project:
        chosen = slug or await self._free_slug(slugify(name))
        if await self.exists(Project.slug == chosen):
            raise ConflictError("this slug is taken", code="slug_taken", param="slug")
        project = Project(id=uuid4(), name=name.strip(), slug=chosen, owner_id=owner_id)
        session = self.repository.session
        try:
            session.add(project)
            await session.flush()
            session.add(ProjectMember(project_id=project.id, user_id=owner_id, role="owner"))
            await session.commit()
        except (IntegrityError, SQLAlchemyIntegrityError) as exc:
            # Two requests raced past the check above: the unique index decides.
            await session.rollback()
            raise ConflictError("this slug is taken", code="slug_taken", param="slug") from exc
        return project

    async def rename(self, project: Project, data: ProjectUpdate) -> Project:
        """Applies a partial update (``UNSET`` keeps the field)."""
        name = None if data.name is msgspec.UNSET else data.name
        slug = None if data.slug is msgspec.UNSET else data.slug
        if slug is not None and slug != project.slug:
            if await self.exists(Project.slug == slug):
                raise ConflictError("this slug is taken", code="slug_taken", param="slug")
            project.slug = slug
        if name is not None:
            project.name = name.strip()
        try:
            return await self.update(project, auto_commit=True)
        except (DuplicateKeyError, IntegrityError) as exc:
            raise ConflictError("this slug is taken", code="slug_taken", param="slug") from exc

    async def names_of(self, ids: Collection[UUID]) -> dict[UUID, str]:
        """The names of these projects by id (a deleted one is missing)."""
        if not ids:
            return {}
        rows = await self.repository.session.execute(
            select(Project.id, Project.name).where(Project.id.in_(ids))
        )
        return {row.id: row.name for row in rows}

    async def owner_emails(self, projects: Iterable[Project]) -> dict[UUID, str]:
        """The email of each project's owner, by user id."""
        owners = {p.owner_id for p in projects}
        if not owners:
            return {}
        rows = await self.repository.session.execute(
            select(User.id, User.email).where(User.id.in_(owners))
        )
        return {row.id: row.email for row in rows}

    async def visible_page(
        self, principal: Principal, limit: int, offset: int
    ) -> tuple[Sequence[tuple[Project, AccessRole]], int]:
        refuse_runtime_tokens(principal)
        session = self.repository.session
        newest_first = (Project.created_at.desc(), Project.id.desc())
        if isinstance(principal, AdminTokenPrincipal):
            total = await session.scalar(select(func.count()).select_from(Project))
            projects = await session.scalars(
                select(Project).order_by(*newest_first).limit(limit).offset(offset)
            )
            return [(p, "admin") for p in projects], int(total or 0)
        if isinstance(principal, ApiKeyPrincipal):
            project = await self.get_one_or_none(Project.id == principal.project_id)
            rows: list[tuple[Project, AccessRole]] = (
                [] if project is None else [(project, "api_key")]
            )
            return rows[offset : offset + limit], len(rows)
        if not isinstance(principal, UserPrincipal):
            return [], 0
        is_admin = await self._active_user_is_admin(principal.user_id)
        membership = and_(
            ProjectMember.project_id == Project.id, ProjectMember.user_id == principal.user_id
        )
        if is_admin:
            base = select(Project, ProjectMember.role).outerjoin(ProjectMember, membership)
        else:
            base = select(Project, ProjectMember.role).join(ProjectMember, membership)
        total = await session.scalar(select(func.count()).select_from(base.subquery()))
        result = await session.execute(base.order_by(*newest_first).limit(limit).offset(offset))
        page: list[tuple[Project, AccessRole]] = []
        for project, member_role in result:
            role = _shown_role(is_admin, member_role)
            if role is not None:
                page.append((project, role))
        return page, int(total or 0)

    async def access(self, principal: Principal, project_id: UUID) -> ProjectAccess:
        """The caller's access to a project; a project they cannot see is a 404."""
        refuse_runtime_tokens(principal)
        project = await self.get_one_or_none(Project.id == project_id)
        if project is None:
            raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")
        if isinstance(principal, AdminTokenPrincipal):
            return ProjectAccess(project, "admin")
        if isinstance(principal, ApiKeyPrincipal) and principal.project_id == project_id:
            return ProjectAccess(project, "api_key")
        if isinstance(principal, UserPrincipal):
            row = (
                await self.repository.session.execute(
                    select(User.is_admin, User.disabled, ProjectMember.role)
                    .outerjoin(
                        ProjectMember,
                        and_(
                            ProjectMember.user_id == User.id,
                            ProjectMember.project_id == project_id,
                        ),
                    )
                    .where(User.id == principal.user_id)
                )
            ).first()
            if row is None or row.disabled:
                raise _account_disabled()
            role = _shown_role(bool(row.is_admin), row.role)
            if role is not None:
                return ProjectAccess(project, role)
        raise NotFoundError(PROJECT_NOT_FOUND, code="project_not_found")

    async def _active_user_is_admin(self, user_id: UUID) -> bool:
        """Whether the user is a platform admin; a disabled (or deleted) account's
        still-valid access token is refused, as it is everywhere else."""
        row = (
            await self.repository.session.execute(
                select(User.is_admin, User.disabled).where(User.id == user_id)
            )
        ).first()
        if row is None or row.disabled:
            raise _account_disabled()
        return bool(row.is_admin)

    async def _free_slug(self, base: str) -> str:
        candidate, n = base, 1
        while await self.exists(Project.slug == candidate):
            n += 1
            suffix = f"-{n}"
            candidate = base[: 64 - len(suffix)] + suffix
        return candidate


def _account_disabled() -> AuthenticationError:
    return AuthenticationError("this account is disabled", code="account_disabled")


class ProjectMemberService(SQLAlchemyAsyncRepositoryService[ProjectMember]):
    class Repo(SQLAlchemyAsyncRepository[ProjectMember]):
        model_type = ProjectMember

    repository_type = Repo

    async def page(
        self, project_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[tuple[ProjectMember, User]], int]:
        session = self.repository.session
        total = await session.scalar(
            select(func.count())
            .select_from(ProjectMember)
            .where(ProjectMember.project_id == project_id)
        )
        rows = await session.execute(
            select(ProjectMember, User)
            .join(User, User.id == ProjectMember.user_id)
            .where(ProjectMember.project_id == project_id)
            .order_by(ProjectMember.created_at, ProjectMember.id)
            .limit(limit)
            .offset(offset)
        )
        return [(member, user) for member, user in rows], int(total or 0)

    async def add_by_email(
        self, project_id: UUID, email: str, role: str
    ) -> tuple[ProjectMember, User]:
        """Adds the active user who has this email (a 404 ``user_not_found`` if none)."""
        user = await self.repository.session.scalar(
            select(User).where(User.email == normalize_email(email))
        )
        if user is None or user.disabled:
            raise NotFoundError(
                "no active user has this email", code="user_not_found", param="email"
            )
        return await self.add(project_id, user, role), user

    async def add(self, project_id: UUID, user: User, role: str) -> ProjectMember:
        if await self.exists(
            ProjectMember.project_id == project_id, ProjectMember.user_id == user.id
        ):
            raise ConflictError("this user is already a member", code="already_member")
        try:
            return await self.create(
                ProjectMember(project_id=project_id, user_id=user.id, role=role), auto_commit=True
            )
        except (DuplicateKeyError, IntegrityError) as exc:
            raise ConflictError("this user is already a member", code="already_member") from exc

    async def remove(self, project: Project, user_id: UUID) -> None:
        member = await self.get_one_or_none(
            ProjectMember.project_id == project.id, ProjectMember.user_id == user_id
        )
        if member is None:
            raise NotFoundError("member not found", code="member_not_found")
        if user_id == project.owner_id:
            raise ConflictError(
                "the project's owner cannot be removed; delete the project instead",
                code="owner_not_removable",
            )
        await self.delete(member.id, auto_commit=True)
