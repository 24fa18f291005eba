"""Project webhooks and the log of their deliveries.

A webhook is a project's HTTPS receiver of its threshold events; its signing secret is
a vault token bound to the row (``app.domain.secrets.aad``). A delivery is one event
sent to one webhook: written once, then updated by every attempt until it is
delivered or failed. The row is the queue: a replica claims a due row by moving its
``next_attempt_at`` past the attempt (the lease) and naming itself in ``lease_owner``,
so a dead replica's rows come back when their lease runs out.
"""

from __future__ import annotations

import datetime
from typing import Any
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class ProjectWebhook(UUIDAuditBase):
    __tablename__ = "project_webhooks"

    project_id: Mapped[UUID] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), index=True
    )
    url: Mapped[str] = mapped_column(String(2048))
    description: Mapped[str] = mapped_column(String(500), default="")
    enabled: Mapped[bool] = mapped_column(default=True)
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    """The event types sent to it (``budget.threshold``); a test event always is."""
    secret_encrypted: Mapped[str] = mapped_column(Text)
    secret_hint: Mapped[str] = mapped_column(String(16))
    # After a rotation the old secret keeps signing (a second ``v1``) until it expires,
    # so receivers can switch without refusing deliveries in between.
    previous_secret_encrypted: Mapped[str | None] = mapped_column(Text, default=None)
    previous_secret_expires_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )


class WebhookDelivery(UUIDAuditBase):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # The dispatcher's claim and its sleep: pending rows, earliest due first.
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        # A webhook's log, newest first.
        Index("ix_webhook_deliveries_webhook_id_created_at", "webhook_id", "created_at"),
        # An alert reaches a webhook once, whatever replays its emission.
        UniqueConstraint("webhook_id", "alert_id", name="uq_webhook_deliveries_alert"),
    )

    webhook_id: Mapped[UUID] = mapped_column(ForeignKey("project_webhooks.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(64))
    """``budget.threshold`` or ``webhook.test``."""
    alert_id: Mapped[str | None] = mapped_column(String(200), default=None)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The JSON body every attempt sends (its ``id`` is this row's)."""
    # pending | delivered | failed
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(String(500), default=None)
    last_response: Mapped[str | None] = mapped_column(String(500), default=None)
    """The start of the receiver's last answer body (never more)."""
    attempt_log: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    """One entry per attempt (``at``, ``statusCode``, ``error``, ``durationMs``), the
    latest few."""
    next_attempt_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    """When a pending row is due (while an attempt runs: when its lease ends); None
    once delivered or failed."""
    lease_owner: Mapped[str | None] = mapped_column(String(128), default=None)
    delivered_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
