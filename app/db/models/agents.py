"""GPU agents: the identities admins create and the models deployed on them.

An agent's live state (machine, GPUs, loaded models, last heartbeat) is written by
whichever replica holds its WebSocket, so every replica and the dashboard read the
same picture, and a restart shows each agent offline until it reconnects.
"""

from __future__ import annotations

import datetime
from typing import Any
from uuid import UUID

from advanced_alchemy.base import UUIDAuditBase
from advanced_alchemy.types import DateTimeUTC
from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column


class AgentNode(UUIDAuditBase):
    __tablename__ = "agent_nodes"

    name: Mapped[str] = mapped_column(String(100), unique=True)
    # SHA-256 of the token: the token itself is shown once and never stored.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_prefix: Mapped[str] = mapped_column(String(32))
    machine_name: Mapped[str | None] = mapped_column(String(200), default=None)
    version: Mapped[str | None] = mapped_column(String(64), default=None)
    host: Mapped[str | None] = mapped_column(String(255), default=None)
    # The last reported GPUs (``app.lib.agent_frames.Gpu`` as dicts) and the models
    # the agent says it serves; read whole, never queried into.
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    models: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Set on register, cleared when that same socket closes: a reconnect through
    # another replica is never marked offline by the old socket's late close.
    connection_id: Mapped[str | None] = mapped_column(String(32), default=None)
    connected_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
    last_heartbeat_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )


class AgentDeployment(UUIDAuditBase):
    """One deploy request of a model on an agent, and what became of it."""

    __tablename__ = "agent_deployments"
    __table_args__ = (Index("ix_agent_deployments_agent_model", "agent_id", "model_id"),)

    agent_id: Mapped[UUID] = mapped_column(ForeignKey("agent_nodes.id", ondelete="CASCADE"))
    model_id: Mapped[str] = mapped_column(String(200))
    # deploying | running | failed | stopping | stopped
    status: Mapped[str] = mapped_column(String(16))
    progress: Mapped[int] = mapped_column(Integer, default=0)
    """Percent, 0-100, as the agent reports it."""
    message: Mapped[str] = mapped_column(String(500), default="")
    port: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    backend_name: Mapped[str | None] = mapped_column(String(100), default=None)
    finished_at: Mapped[datetime.datetime | None] = mapped_column(
        DateTimeUTC(timezone=True), default=None
    )
