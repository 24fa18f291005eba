"""The price book of token calls: one row per price and the moment it takes effect.

A change of price is a new row with a later ``effective_from``; rows already in force
are history and never rewritten (``app.domain.prices.services``). Amounts are exact
integers: micro-units of ``currency`` per million tokens (``150_000`` is 0.15 USD per
million tokens), so costs add up without float noise.
"""

from __future__ import annotations

import datetime
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column


class ModelPrice(UUIDAuditBase):
    __tablename__ = "model_prices"
    __table_args__ = (
        # The price book loads one owner's rows at a time (platform: project_id NULL).
        Index("ix_model_prices_project_id_model", "project_id", "model"),
    )

    model: Mapped[str] = mapped_column(String(200))
    """A base model, alias or profile id, as a request names it."""
    backend: Mapped[str | None] = mapped_column(String(100), default=None)
    """Only for calls served by this backend (an override of the model-wide price)."""
    # A project's own prices (its custom LLMs and override-key calls) go with it.
    project_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), default=None
    )
    input_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_input_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """None: cached prompt tokens cost the input price."""
    output_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    embedding_micros: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """None: embedding tokens cost the input price."""
    currency: Mapped[str] = mapped_column(String(3), default="USD")
    effective_from: Mapped[datetime.datetime] = mapped_column(DateTimeUTC(timezone=True))
