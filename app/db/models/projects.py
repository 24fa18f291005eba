from __future__ import annotations

import datetime
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class Project(UUIDAuditBase):
    __tablename__ = "project"

    name: Mapped[str] = mapped_column(String(200))
    slug: Mapped[str] = mapped_column(String(100), unique=True)
    owner_id: Mapped[UUID] = mapped_column(ForeignKey("user_account.id", ondelete="RESTRICT"))


class ProjectMember(UUIDAuditBase):
    __tablename__ = "project_member"
    __table_args__ = (
        UniqueConstraint("project_id", "user_id", name="uq_project_member_project_user"),
        Index("ix_project_member_user_id", "user_id"),
    )

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    user_id: Mapped[UUID] = mapped_column(ForeignKey("user_account.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(20))


class ApiKey(UUIDAuditBase):
    __tablename__ = "api_key"
    __table_args__ = (Index("ix_api_key_project_id", "project_id"),)

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(32))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_by_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("user_account.id", ondelete="SET NULL"), default=None
    )
    last_used_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    revoked_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )


class RuntimeToken(UUIDAuditBase):
    """A runtime JWT's record; its ``id`` is the token's ``jti``."""

    __tablename__ = "runtime_token"
    __table_args__ = (Index("ix_runtime_token_project_id", "project_id"),)

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200), default="")
    expires_at: Mapped[datetime.datetime] = mapped_column(DateTimeUTC(timezone=True))
    created_by_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("user_account.id", ondelete="SET NULL"), default=None
    )
    revoked_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
