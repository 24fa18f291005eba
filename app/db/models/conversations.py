"""Runtime conversations, their stored messages and sticky fallback pins."""

from __future__ import annotations

import datetime
from typing import Any
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase, UUIDBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import JSON, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.lib.clock import utcnow


class Conversation(UUIDAuditBase):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_project_id_created_at", "project_id", "created_at"),)

    project_id: Mapped[UUID] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200), default="")
    model_profile_id: Mapped[str | None] = mapped_column(String(64), default=None)
    priority: Mapped[bool] = mapped_column(default=False)
    # No foreign key: a fork outlives the conversation it was forked from.
    forked_from_id: Mapped[UUID | None] = mapped_column(default=None)
    message_count: Mapped[int] = mapped_column(default=0)


class ConversationMessage(UUIDBase):
    __tablename__ = "conversation_messages"
    __table_args__ = (
        UniqueConstraint("conversation_id", "seq", name="uq_conversation_messages_seq"),
    )

    conversation_id: Mapped[UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    seq: Mapped[int]
    """Position in the conversation, from 1; the order messages are replayed in."""
    role: Mapped[str] = mapped_column(String(20))
    # A string or OpenAI content parts (text, image_url); None for a pure tool call.
    content: Mapped[Any] = mapped_column(JSON, default=None, nullable=True)
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    tool_calls: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    tool_call_id: Mapped[str | None] = mapped_column(String(200), default=None)
    # Where an assistant turn came from (None on user turns).
    model_profile_id: Mapped[str | None] = mapped_column(String(64), default=None)
    backend: Mapped[str | None] = mapped_column(String(100), default=None)
    prompt_tokens: Mapped[int | None] = mapped_column(default=None)
    completion_tokens: Mapped[int | None] = mapped_column(default=None)
    created_at: Mapped[datetime.datetime] = mapped_column(
        DateTimeUTC(timezone=True), default=utcnow
    )


class FallbackPin(UUIDAuditBase):
    """A conversation moved to its profile's fallback after a dropped stream; it stays
    until an admin clears it."""

    __tablename__ = "fallback_pins"

    conversation_id: Mapped[UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), unique=True
    )
    project_id: Mapped[UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), index=True
    )
    from_profile_id: Mapped[str] = mapped_column(String(64))
    to_profile_id: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(32))
    """``upstream_dropped`` or ``client_disconnected``."""
    backend: Mapped[str | None] = mapped_column(String(100), default=None)
