"""What project owners control: secrets, custom LLM endpoints, BYO override keys, quotas.

Every encrypted column holds a vault token whose associated data binds it to its
row (kind, project id, row id): copied to another row or project it no longer
decrypts. ``*_hint`` columns keep the masked last four characters for display.
"""

from __future__ import annotations

import datetime
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class ProjectSecret(UUIDAuditBase):
    __tablename__ = "project_secrets"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_project_secrets_name"),)

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    description: Mapped[str] = mapped_column(String(500), default="")
    value_encrypted: Mapped[str] = mapped_column(Text)
    hint: Mapped[str] = mapped_column(String(16))
    rotated_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )


class CustomLlm(UUIDAuditBase):
    """A project's own OpenAI-compatible endpoint, served to it as ``custom:<name>``."""

    __tablename__ = "custom_llms"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_custom_llms_name"),)

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    template: Mapped[str] = mapped_column(String(16))
    """``bob`` (every technical field locked) or ``custom``."""
    base_url: Mapped[str] = mapped_column(String(2048))
    model: Mapped[str] = mapped_column(String(200))
    auth_scheme: Mapped[str] = mapped_column(String(16))
    """``bearer``, ``api-key`` (header), ``ApiKey`` (Authorization scheme) or ``none``."""
    provider: Mapped[str] = mapped_column(String(64))
    max_input_tokens: Mapped[int]
    max_output_tokens: Mapped[int]
    enabled: Mapped[bool] = mapped_column(default=True)
    # RESTRICT backs the service's 409: a secret in use cannot disappear under a row.
    secret_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("project_secrets.id", ondelete="RESTRICT"), default=None, index=True
    )
    api_key_encrypted: Mapped[str | None] = mapped_column(Text, default=None)
    api_key_hint: Mapped[str | None] = mapped_column(String(16), default=None)


class OverrideKey(UUIDAuditBase):
    """A provider key of the project's own, used for one conversation and the models
    whose id starts with ``model_prefix``."""

    __tablename__ = "override_keys"
    __table_args__ = (
        UniqueConstraint(
            "project_id", "conversation_id", "model_prefix", name="uq_override_keys_target"
        ),
        Index("ix_override_keys_project_conversation", "project_id", "conversation_id"),
    )

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    conversation_id: Mapped[str] = mapped_column(String(200))
    model_prefix: Mapped[str] = mapped_column(String(200))
    key_encrypted: Mapped[str] = mapped_column(Text)
    key_hint: Mapped[str] = mapped_column(String(16))


class ProjectQuota(UUIDAuditBase):
    """Request, token and money limits per window. The admin sets the ceiling; an
    owner may lower it (the lower of the two applies). ``None`` is no limit."""

    __tablename__ = "project_quotas"

    project_id: Mapped[UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), unique=True
    )
    per_minute: Mapped[int | None] = mapped_column(default=None)
    per_day: Mapped[int | None] = mapped_column(default=None)
    per_month: Mapped[int | None] = mapped_column(default=None)
    owner_per_minute: Mapped[int | None] = mapped_column(default=None)
    owner_per_day: Mapped[int | None] = mapped_column(default=None)
    owner_per_month: Mapped[int | None] = mapped_column(default=None)
    fail_closed: Mapped[bool] = mapped_column(default=False)
    """When the state store is unreachable: refuse (True) or admit (False, default)."""
    # Tokens (prompt + completion) per window, and money per day and month in
    # micro-units of the price book's currency; the same ceiling/owner rule.
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, default=None)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger, default=None)
    tokens_per_month: Mapped[int | None] = mapped_column(BigInteger, default=None)
    budget_per_day_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
    budget_per_month_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
    owner_tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, default=None)
    owner_tokens_per_day: Mapped[int | None] = mapped_column(BigInteger, default=None)
    owner_tokens_per_month: Mapped[int | None] = mapped_column(BigInteger, default=None)
    owner_budget_per_day_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
    owner_budget_per_month_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
