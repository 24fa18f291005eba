"""Video generation jobs and the per-model video prices.

A job row is the whole truth about a generation: the poller of whichever replica holds
its lease reads and writes it, the API and the notifications are views of it.
"""

from __future__ import annotations

import datetime
from typing import Any
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, Numeric, String, Text
from sqlalchemy.orm import Mapped, mapped_column

# Exact in PostgreSQL (numeric), read as float: prices are small decimal amounts and the
# API speaks JSON numbers.
Money = Numeric(18, 6, asdecimal=False)


class VideoJob(UUIDAuditBase):
    __tablename__ = "video_jobs"
    __table_args__ = (
        # The poller's claim: unfinished jobs that are due, oldest due first.
        Index("ix_video_jobs_status_next_poll_at", "status", "next_poll_at"),
        # A replica releasing what it holds at shutdown.
        Index("ix_video_jobs_lease_owner", "lease_owner"),
        # Listing an owner's jobs, newest first.
        Index("ix_video_jobs_project_id_created_at", "project_id", "created_at"),
        Index("ix_video_jobs_user_id_created_at", "user_id", "created_at"),
    )

    # CASCADE: a project's jobs go with it (the usage records stay, detached).
    project_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), default=None
    )
    # No foreign keys: keys and users come and go, the job's history stays.
    api_key_id: Mapped[UUID | None] = mapped_column(default=None)
    user_id: Mapped[UUID | None] = mapped_column(default=None)
    model: Mapped[str] = mapped_column(String(200))
    """The model the client asked for."""
    model_served: Mapped[str | None] = mapped_column(String(200), default=None)
    backend: Mapped[str | None] = mapped_column(String(100), default=None)
    """The backend that accepted the task: polls go there and nowhere else."""
    provider_hint: Mapped[str | None] = mapped_column(String(100), default=None)
    provider_task_id: Mapped[str | None] = mapped_column(String(200), default=None)
    file_id: Mapped[str | None] = mapped_column(String(200), default=None)
    stream_id: Mapped[str] = mapped_column(String(64), unique=True)

    prompt: Mapped[str] = mapped_column(Text)
    negative_prompt: Mapped[str | None] = mapped_column(Text, default=None)
    duration_seconds: Mapped[float] = mapped_column(Float)
    width: Mapped[int | None] = mapped_column(Integer, default=None)
    height: Mapped[int | None] = mapped_column(Integer, default=None)
    # The first frame as a data URL, kept only until the provider accepted the task and
    # cleared then: an image of up to 10 MiB is not worth keeping for the job's life.
    first_frame_image: Mapped[str | None] = mapped_column(Text, default=None)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    # queued | running | done | failed | cancelled
    status: Mapped[str] = mapped_column(String(16))
    progress: Mapped[int] = mapped_column(Integer, default=0)
    provider_status: Mapped[str | None] = mapped_column(String(32), default=None)
    result_url: Mapped[str | None] = mapped_column(Text, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    cost: Mapped[float | None] = mapped_column(Money, default=None)

    submitted_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    finished_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    next_poll_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    """When the poller should look at the job next (None once it is finished)."""
    polls: Mapped[int] = mapped_column(Integer, default=0)
    """Steps taken so far (submissions and polls); the backoff grows with it."""
    # The replica driving the job right now, until ``lease_expires_at``; a replica that
    # dies lets the lease run out and another one takes the job over.
    lease_owner: Mapped[str | None] = mapped_column(String(64), default=None)
    lease_expires_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )


class VideoPrice(UUIDAuditBase):
    """How a model's generations are priced (see ``app.domain.video.pricing``)."""

    __tablename__ = "video_prices"

    model: Mapped[str] = mapped_column(String(200), unique=True)
    # per_call | per_second_resolution | per_frame
    mode: Mapped[str] = mapped_column(String(32))
    base: Mapped[float] = mapped_column(Money, default=0.0)
    price_per_second: Mapped[float] = mapped_column(Money, default=0.0)
    # Short side in pixels as a string ("720", "1080") or "*" -> coefficient.
    resolution_coeffs: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    price_per_frame: Mapped[float] = mapped_column(Money, default=0.0)
    fps: Mapped[float] = mapped_column(Float, default=24.0)
    currency: Mapped[str | None] = mapped_column(String(16), default=None)
