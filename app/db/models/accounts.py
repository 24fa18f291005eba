from __future__ import annotations

import datetime
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column


class User(UUIDAuditBase):
    __tablename__ = "user_account"

    # Stored lower-cased so uniqueness is case-insensitive on every database.
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    password_hash: Mapped[str] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(default=False)
    disabled: Mapped[bool] = mapped_column(default=False)


class RefreshToken(UUIDAuditBase):
    """One link of a rotating refresh-token family.

    Reuse of a spent link means the token leaked: the whole family is revoked.
    """

    __tablename__ = "refresh_token"
    __table_args__ = (Index("ix_refresh_token_family_id", "family_id"),)

    user_id: Mapped[UUID] = mapped_column(ForeignKey("user_account.id", ondelete="CASCADE"))
    family_id: Mapped[UUID]
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime.datetime] = mapped_column(DateTimeUTC(timezone=True))
    used_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    revoked_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )


class TokenRevocation(UUIDAuditBase):
    """A revoked JWT whose own row is gone (a deleted project's runtime tokens).

    JWTs are checked without the database; the marks live in the ``StateStore``,
    which an embedded deployment keeps in memory. Start-up and a Redis outage reload
    them from here, so a deleted project's tokens stay refused until they expire.
    """

    __tablename__ = "token_revocation"
    __table_args__ = (Index("ix_token_revocation_expires_at", "expires_at"),)

    jti: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime.datetime] = mapped_column(DateTimeUTC(timezone=True))
