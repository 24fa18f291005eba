from __future__ import annotations

import datetime
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, declared_attr, mapped_column


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


class KeyGovernanceColumns:
    """What an owner may set on an API key or a runtime token (all optional): the
    models it may call (exact ids, or prefixes written with a trailing ``*``),
    requests and tokens per minute, a money budget in micro-units per ``day`` or
    ``month``, and free-form labels (string -> string)."""

    @declared_attr
    def allowed_models(cls) -> Mapped[list[str] | None]:
        return mapped_column(JSON, default=None, nullable=True)

    @declared_attr
    def rpm(cls) -> Mapped[int | None]:
        return mapped_column(Integer, default=None, nullable=True)

    @declared_attr
    def tpm(cls) -> Mapped[int | None]:
        return mapped_column(Integer, default=None, nullable=True)

    @declared_attr
    def budget_micros(cls) -> Mapped[int | None]:
        return mapped_column(BigInteger, default=None, nullable=True)

    @declared_attr
    def budget_period(cls) -> Mapped[str | None]:
        return mapped_column(String(8), default=None, nullable=True)

    @declared_attr
    def labels(cls) -> Mapped[dict[str, str] | None]:
        return mapped_column(JSON, default=None, nullable=True)


class ApiKey(KeyGovernanceColumns, UUIDAuditBase):
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
    expires_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None, nullable=True
    )


class RuntimeToken(KeyGovernanceColumns, UUIDAuditBase):
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
