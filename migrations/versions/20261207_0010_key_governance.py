"""key governance: allowed models, rate and token limits, budget, expiry, labels

Optional columns on ``api_key`` and ``runtime_token``: ``allowed_models`` (JSON list
of exact model ids or prefixes ending in ``*``), ``rpm`` and ``tpm`` (per minute),
``budget_micros`` with ``budget_period`` (``day`` or ``month``) and ``labels`` (JSON
object). ``api_key`` also gets ``expires_at`` (a runtime token already has one, the
expiry signed into its JWT). Existing rows keep null: nothing changes for them.

Independent of any 0009 table; the revision after 0008 on this branch.

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-07 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

sa.GUID = GUID  # type: ignore[attr-defined]
sa.DateTimeUTC = DateTimeUTC  # type: ignore[attr-defined]

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_TABLES = ("api_key", "runtime_token")


def _governance_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("budget_micros", sa.BigInteger(), nullable=True),
        sa.Column("budget_period", sa.String(length=8), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=True),
    ]


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in _governance_columns():
                batch_op.add_column(column)
    with op.batch_alter_table("api_key", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("expires_at", sa.DateTimeUTC(timezone=True), nullable=True)  # type: ignore[attr-defined]
        )


def downgrade() -> None:
    with op.batch_alter_table("api_key", schema=None) as batch_op:
        batch_op.drop_column("expires_at")
    for table in reversed(_TABLES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in reversed(_governance_columns()):
                batch_op.drop_column(column.name)
