"""Registered backends and model aliases: the durable half of the routing registry."""

from __future__ import annotations

from advanced_alchemy.base import UUIDAuditBase
from sqlalchemy import JSON, String, Text
from sqlalchemy.orm import Mapped, mapped_column


class BackendConfig(UUIDAuditBase):
    __tablename__ = "backend_configs"

    name: Mapped[str] = mapped_column(String(100), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(String(2048))
    # A vault token whose associated data is ("backend_config", id): copied to another
    # row it no longer decrypts.
    api_key_encrypted: Mapped[str | None] = mapped_column(Text, default=None)
    # Plain JSON (advanced-alchemy's JsonB does not load under SQLAlchemy 2.1); the list
    # is read whole, never queried into.
    models: Mapped[list[str]] = mapped_column(JSON, default=list)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    """A profile's tags must all be here for the backend to serve that profile."""
    max_concurrency: Mapped[int | None] = mapped_column(default=None)
    """Requests the backend runs at once (its batch slots), when the operator knows it;
    None: routing learns it from the backend's metrics."""


class ModelAlias(UUIDAuditBase):
    __tablename__ = "model_aliases"

    alias: Mapped[str] = mapped_column(String(200), unique=True)
    target: Mapped[str] = mapped_column(String(200))
