"""token revocations

Revoked JWTs whose own row is deleted (a deleted project's runtime tokens go with the
project): kept until the token would have expired, so start-up and a Redis outage can
reload the marks into the state store. Read by ``expires_at``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 09:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from advanced_alchemy.types import GUID, DateTimeUTC
from alembic import op

sa.GUID = GUID  # type: ignore[attr-defined]
sa.DateTimeUTC = DateTimeUTC  # type: ignore[attr-defined]

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "token_revocation",
        sa.Column("id", sa.GUID(length=16), nullable=False),
        sa.Column("jti", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.Column("sa_orm_sentinel", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTimeUTC(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_token_revocation")),
        sa.UniqueConstraint("jti", name=op.f("uq_token_revocation_jti")),
    )
    with op.batch_alter_table("token_revocation", schema=None) as batch_op:
        batch_op.create_index("ix_token_revocation_expires_at", ["expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("token_revocation", schema=None) as batch_op:
        batch_op.drop_index("ix_token_revocation_expires_at")

    op.drop_table("token_revocation")
