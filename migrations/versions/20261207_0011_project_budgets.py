"""project budgets and token limits beside the request quota

``project_quotas`` gets token limits per minute, day and month and money budgets per
day and month (micro-units of the price book's currency), each as an admin ceiling
and an owner's own lower limit, like the request windows. Existing rows keep null:
no new limit applies to anyone. ``usage_records`` gets an index for each key's spend
in its budget period (project, key, time).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 03:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_LIMITS = (
    "tokens_per_minute",
    "tokens_per_day",
    "tokens_per_month",
    "budget_per_day_micros",
    "budget_per_month_micros",
)


def _columns() -> list[str]:
    return [*_LIMITS, *(f"owner_{name}" for name in _LIMITS)]


_KEY_SPEND_INDEX = "ix_usage_records_project_id_api_key_id_created_at"


def upgrade() -> None:
    with op.batch_alter_table("project_quotas", schema=None) as batch_op:
        for name in _columns():
            batch_op.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
    op.create_index(_KEY_SPEND_INDEX, "usage_records", ["project_id", "api_key_id", "created_at"])


def downgrade() -> None:
    op.drop_index(_KEY_SPEND_INDEX, table_name="usage_records")
    with op.batch_alter_table("project_quotas", schema=None) as batch_op:
        for name in reversed(_columns()):
            batch_op.drop_column(name)
