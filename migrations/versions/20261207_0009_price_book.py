"""price book, exact usage cost

A ``model_prices`` table (per model, optionally per backend, platform-wide or a
project's own; exact integer micro-units per million tokens; a price takes effect at
``effective_from`` and a change is a new row) and on ``usage_records`` the exact cost:
``cost_micros``, ``currency`` and ``cost_estimated``. Rows priced before (video
generations) get ``cost_micros`` from their ``cost``; ``cost`` stays as it was.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

sa.GUID = GUID  # type: ignore[attr-defined]
sa.DateTimeUTC = DateTimeUTC  # type: ignore[attr-defined]

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_prices",
        sa.Column("id", sa.GUID(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("backend", sa.String(length=100), nullable=True),
        sa.Column("project_id", sa.GUID(length=16), nullable=True),
        sa.Column("input_micros", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_micros", sa.BigInteger(), nullable=True),
        sa.Column("output_micros", sa.BigInteger(), nullable=False),
        sa.Column("embedding_micros", sa.BigInteger(), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("effective_from", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.Column("sa_orm_sentinel", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_model_prices_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_prices")),
    )
    with op.batch_alter_table("model_prices", schema=None) as batch_op:
        batch_op.create_index(
            "ix_model_prices_project_id_model", ["project_id", "model"], unique=False
        )

    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cost_micros", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("currency", sa.String(length=16), nullable=True))
        # The server default fills the existing rows, and the rows of replicas still
        # running the code before this revision (their INSERTs name no such column).
        batch_op.add_column(
            sa.Column("cost_estimated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(
        "UPDATE usage_records SET cost_micros = CAST(ROUND(cost * 1000000) AS BIGINT) "
        "WHERE cost IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None) as batch_op:
        batch_op.drop_column("cost_estimated")
        batch_op.drop_column("currency")
        batch_op.drop_column("cost_micros")

    with op.batch_alter_table("model_prices", schema=None) as batch_op:
        batch_op.drop_index("ix_model_prices_project_id_model")

    op.drop_table("model_prices")
