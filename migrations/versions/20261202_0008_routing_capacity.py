"""routing capacity: backend batch slots, a profile's routing score

A nullable ``max_concurrency`` on backends (the requests it runs at once, when the
operator knows it; null: routing learns it from the backend's metrics) and a nullable
``routing_score`` on model profiles (``seed`` or ``capacity``; null: the platform
default, ``ARONA_ROUTING_SCORE``). Existing rows keep null: nothing changes for them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

sa.GUID = GUID  # type: ignore[attr-defined]
sa.DateTimeUTC = DateTimeUTC  # type: ignore[attr-defined]

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("backend_configs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_concurrency", sa.Integer(), nullable=True))

    with op.batch_alter_table("model_profiles", schema=None) as batch_op:
        batch_op.add_column(sa.Column("routing_score", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_profiles", schema=None) as batch_op:
        batch_op.drop_column("routing_score")

    with op.batch_alter_table("backend_configs", schema=None) as batch_op:
        batch_op.drop_column("max_concurrency")
