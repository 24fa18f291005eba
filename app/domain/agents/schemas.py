"""Bodies of the agents admin API (camelCase on the wire, like the other admin APIs)."""

from __future__ import annotations

import datetime
from typing import Annotated, Literal
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict
from app.lib.agent_frames import ModelId

AgentName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
DeploymentStatus = Literal["deploying", "running", "failed", "stopping", "stopped"]
ACTIVE_STATUSES: frozenset[str] = frozenset({"deploying", "running", "stopping"})


class AgentCreate(Strict):
    name: AgentName


class GpuOut(Camel):
    index: int
    name: str
    memory_total_mb: int
    memory_used_mb: int
    utilization_percent: float


class GpuSummary(Camel):
    count: int
    memory_total_mb: int
    memory_used_mb: int
    average_utilization_percent: float | None
    """None when the agent reports no GPUs: it has no telemetry."""


class AgentOut(Camel):
    id: UUID
    name: str
    token_prefix: str
    online: bool
    machine_name: str | None
    version: str | None
    host: str | None
    gpus: list[GpuOut]
    gpu_summary: GpuSummary
    models: list[str]
    connected_at: datetime.datetime | None
    last_heartbeat_at: datetime.datetime | None
    created_at: datetime.datetime


class AgentCreated(AgentOut):
    token: str = ""
    """Shown once: only its hash is stored."""


class DeployIn(Strict):
    model_id: ModelId
    agent_id: UUID | None = None
    """None: the online agent with the lowest average GPU utilization."""


class DeploymentOut(Camel):
    id: UUID
    agent_id: UUID
    agent_name: str
    model_id: str
    status: str
    progress: int
    message: str
    port: int | None
    error: str | None
    backend_name: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    finished_at: datetime.datetime | None
