"""Bodies of the price APIs (camelCase on the wire).

Amounts are per million tokens, in units of ``currency``, given as a decimal string
(``"0.15"``) or a JSON number, with at most six decimals (the book stores exact
micro-units); they are answered as decimal strings so no client reads float noise.
"""

from __future__ import annotations

import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

Model = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Backend = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
Currency = Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}$")]
"""An ISO 4217 code: three capital letters."""
Amount = str | int | float
"""Checked by ``app.domain.prices.amounts.micros``."""


class PriceIn(Strict):
    """A new price. ``effectiveFrom`` absent: now; it may not be in the past (history
    is never rewritten)."""

    model: Model
    input: Amount
    output: Amount
    cached_input: Amount | None = None
    """``null``: cached prompt tokens cost ``input``."""
    embedding: Amount | None = None
    """``null``: embedding tokens cost ``input``."""
    backend: Backend | None = None
    """Only for calls served by this backend (beats the model-wide price)."""
    currency: Currency = "USD"
    effective_from: datetime.datetime | None = None


class PriceUpdate(Strict):
    """Changes to a price that is not in force yet (absent: unchanged)."""

    model: Model | msgspec.UnsetType = msgspec.UNSET
    input: Amount | msgspec.UnsetType = msgspec.UNSET
    output: Amount | msgspec.UnsetType = msgspec.UNSET
    cached_input: Amount | msgspec.UnsetType | None = msgspec.UNSET
    embedding: Amount | msgspec.UnsetType | None = msgspec.UNSET
    backend: Backend | msgspec.UnsetType | None = msgspec.UNSET
    currency: Currency | msgspec.UnsetType = msgspec.UNSET
    effective_from: datetime.datetime | msgspec.UnsetType = msgspec.UNSET


class PriceOut(Camel):
    id: UUID
    model: str
    backend: str | None
    project_id: UUID | None
    """``null``: a platform price."""
    input: str
    cached_input: str | None
    output: str
    embedding: str | None
    currency: str
    effective_from: datetime.datetime
    in_force: bool
    """Whether ``effectiveFrom`` has passed (then the row is history: read only)."""
    created_at: datetime.datetime
