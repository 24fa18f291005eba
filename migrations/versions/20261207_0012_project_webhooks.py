"""project webhooks and their delivery log

``project_webhooks``: a project's HTTPS receivers of threshold events (URL, enabled,
event types, the signing secret as a vault token bound to the row, and the previous
secret while it still signs after a rotation). ``webhook_deliveries``: one row per
event and webhook, updated by every attempt; the row is the dispatcher's queue
(``status`` + ``next_attempt_at`` index for its claim, a lease owner), and an alert
reaches a webhook once (unique ``webhook_id, alert_id``). Both go with their project.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 04:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

sa.GUID = GUID  # type: ignore[attr-defined]
sa.DateTimeUTC = DateTimeUTC  # type: ignore[attr-defined]

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _audit_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("sa_orm_sentinel", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTimeUTC(timezone=True), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "project_webhooks",
        sa.Column("id", sa.GUID(length=16), nullable=False),
        sa.Column("project_id", sa.GUID(length=16), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret_encrypted", sa.Text(), nullable=False),
        sa.Column("secret_hint", sa.String(length=16), nullable=False),
        sa.Column("previous_secret_encrypted", sa.Text(), nullable=True),
        sa.Column("previous_secret_expires_at", sa.DateTimeUTC(timezone=True), nullable=True),
        *_audit_columns(),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_project_webhooks_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project_webhooks")),
    )
    with op.batch_alter_table("project_webhooks", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_project_webhooks_project_id"), ["project_id"], unique=False
        )

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.GUID(length=16), nullable=False),
        sa.Column("webhook_id", sa.GUID(length=16), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("alert_id", sa.String(length=200), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("last_response", sa.String(length=500), nullable=True),
        sa.Column("attempt_log", sa.JSON(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTimeUTC(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("delivered_at", sa.DateTimeUTC(timezone=True), nullable=True),
        *_audit_columns(),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["project_webhooks.id"],
            name=op.f("fk_webhook_deliveries_webhook_id_project_webhooks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("webhook_id", "alert_id", name="uq_webhook_deliveries_alert"),
    )
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_webhook_deliveries_status_next_attempt_at",
            ["status", "next_attempt_at"],
            unique=False,
        )
        batch_op.create_index(
            "ix_webhook_deliveries_webhook_id_created_at",
            ["webhook_id", "created_at"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_deliveries_webhook_id_created_at")
        batch_op.drop_index("ix_webhook_deliveries_status_next_attempt_at")
    op.drop_table("webhook_deliveries")

    with op.batch_alter_table("project_webhooks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_project_webhooks_project_id"))
    op.drop_table("project_webhooks")
