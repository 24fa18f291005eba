"""Usage records: one append-only row per metered call."""

from __future__ import annotations

import datetime
from uuid import UUID

from advanced_alchemy.base import UUIDBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import BigInteger, ForeignKey, Index, Numeric, String, false
from sqlalchemy.orm import Mapped, mapped_column

from app.lib.clock import utcnow


class UsageRecord(UUIDBase):
    __tablename__ = "usage_records"
    __table_args__ = (
        Index("ix_usage_records_project_id_created_at", "project_id", "created_at"),
        # Each key's spend in its budget period (the Keys tab, the key API's ``spend``).
        Index(
            "ix_usage_records_project_id_api_key_id_created_at",
            "project_id",
            "api_key_id",
            "created_at",
        ),
    )

    # SET NULL, not CASCADE: billing history outlives the project.
    project_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("project.id", ondelete="SET NULL"), default=None
    )
    # No foreign keys: keys and users come and go, their history stays. The
    # credential that made the call: an API key's id, or a runtime token's (runtime
    # chats), so that each key's and token's spend can be read from here.
    api_key_id: Mapped[UUID | None] = mapped_column(default=None)
    user_id: Mapped[UUID | None] = mapped_column(default=None)
    model_requested: Mapped[str] = mapped_column(String(200))
    model_served: Mapped[str | None] = mapped_column(String(200), default=None)
    backend: Mapped[str | None] = mapped_column(String(100), default=None)
    endpoint: Mapped[str] = mapped_column(String(32))
    streamed: Mapped[bool] = mapped_column(default=False)
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    total_tokens: Mapped[int] = mapped_column(default=0)
    estimated: Mapped[bool] = mapped_column(default=False)
    status: Mapped[int]
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    latency_ms: Mapped[int] = mapped_column(default=0)
    ttft_ms: Mapped[int | None] = mapped_column(default=None)
    conversation_id: Mapped[str | None] = mapped_column(String(200), default=None)
    model_profile_id: Mapped[str | None] = mapped_column(String(64), default=None)
    # Traffic that does not count against the project's quota.
    is_custom: Mapped[bool] = mapped_column(default=False)
    is_override_key: Mapped[bool] = mapped_column(default=False)
    # What the call cost, None when unpriced. ``cost_micros`` is the exact amount in
    # micro-units of ``currency``; ``cost`` (a float in Python) is the same amount,
    # kept for the readers and sums that predate it.
    cost: Mapped[float | None] = mapped_column(Numeric(18, 6, asdecimal=False), default=None)
    cost_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
    currency: Mapped[str | None] = mapped_column(String(16), default=None)
    # Priced from estimated usage (the upstream reported none).
    # The server default: replicas older than this column insert rows without it.
    cost_estimated: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime.datetime] = mapped_column(
        DateTimeUTC(timezone=True), default=utcnow, index=True
    )
