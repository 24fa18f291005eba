"""Model profiles (the runtime catalog) and each project's choice among them."""

from __future__ import annotations

from uuid import UUID

from advanced_alchemy.base import AdvancedDeclarativeBase, CommonTableAttributes, UUIDAuditBase
from advanced_alchemy.mixins import AuditColumns
from sqlalchemy import JSON, ForeignKey, String
from sqlalchemy.ext.asyncio import AsyncAttrs
from sqlalchemy.orm import Mapped, mapped_column


class ModelProfile(CommonTableAttributes, AuditColumns, AdvancedDeclarativeBase, AsyncAttrs):
    """A named model choice runtimes ask for (``llm``, ``llm-smart``): the id is the
    public, url-safe name, so it is the primary key itself."""

    __tablename__ = "model_profiles"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    base_model: Mapped[str] = mapped_column(String(200))
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    supports_tools: Mapped[bool] = mapped_column(default=False)
    supports_images: Mapped[bool] = mapped_column(default=False)
    context_window_tokens: Mapped[int] = mapped_column(default=8192)
    max_output_tokens: Mapped[int] = mapped_column(default=2048)
    enabled: Mapped[bool] = mapped_column(default=True)
    # Plain ids, not foreign keys: the service refuses to delete a profile another
    # one still names, with a message saying which.
    fallback_profile_id: Mapped[str | None] = mapped_column(String(64), default=None)
    slow_threshold_ms: Mapped[int | None] = mapped_column(default=None)
    failover_chain: Mapped[list[str]] = mapped_column(JSON, default=list)
    """Profile ids tried in order when this one is slow (latency failover)."""
    routing_score: Mapped[str | None] = mapped_column(String(16), default=None)
    """How routing ranks backends for this profile (``seed`` or ``capacity``); None:
    the platform default (``ARONA_ROUTING_SCORE``)."""


class ProjectProfileSettings(UUIDAuditBase):
    """A project's default profile and enabled set; no row means every enabled
    profile, with the first by id as default."""

    __tablename__ = "project_profile_settings"

    project_id: Mapped[UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), unique=True
    )
    default_profile_id: Mapped[str | None] = mapped_column(String(64), default=None)
    # None: every globally enabled profile (new profiles appear without a change).
    enabled_profile_ids: Mapped[list[str] | None] = mapped_column(JSON, default=None)


class PlatformSetting(UUIDAuditBase):
    """Operator switches shared by every replica (``failover.latency.enabled``)."""

    __tablename__ = "platform_settings"

    key: Mapped[str] = mapped_column(String(100), unique=True)
    value: Mapped[object] = mapped_column(JSON)
