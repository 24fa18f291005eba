"""Stored rows -> admin API bodies (also what the dashboard shows)."""

from __future__ import annotations

import datetime

from app.db.models import AgentDeployment, AgentNode
from app.domain.agents.schemas import AgentOut, DeploymentOut, GpuOut, GpuSummary
from app.domain.agents.services import is_online, stored_gpus
from app.domain.records import copied
from app.lib.agent_frames import average_utilization
from app.lib.clock import utcnow


def agent_out(
    row: AgentNode, offline_seconds: float, now: datetime.datetime | None = None
) -> AgentOut:
    gpus = stored_gpus(row)
    average = average_utilization(gpus)
    return copied(
        AgentOut,
        row,
        online=is_online(row, now or utcnow(), offline_seconds),
        gpus=[copied(GpuOut, g) for g in gpus],
        gpu_summary=GpuSummary(
            count=len(gpus),
            memory_total_mb=sum(g.memory_total_mb for g in gpus),
            memory_used_mb=sum(g.memory_used_mb for g in gpus),
            average_utilization_percent=None if average is None else round(average, 1),
        ),
        models=list(row.models or ()),
    )


def deployment_out(row: AgentDeployment, agent_name: str) -> DeploymentOut:
    return copied(DeploymentOut, row, agent_name=agent_name)
