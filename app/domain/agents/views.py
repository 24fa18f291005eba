"""Stored rows -> admin API bodies (also what the dashboard shows)."""

from __future__ import annotations

import datetime

from app.db.models import AgentDeployment, AgentNode
from app.domain.agents.schemas import AgentOut, DeploymentOut, GpuOut, GpuSummary
from app.domain.agents.services import is_online, stored_gpus
from app.lib.agent_frames import average_utilization
from app.lib.clock import utcnow


def agent_out(
    row: AgentNode, offline_seconds: float, now: datetime.datetime | None = None
) -> AgentOut:
    gpus = stored_gpus(row)
    average = average_utilization(gpus)
    return AgentOut(
        id=row.id,
        name=row.name,
        token_prefix=row.token_prefix,
        online=is_online(row, now or utcnow(), offline_seconds),
        machine_name=row.machine_name,
        version=row.version,
        host=row.host,
        gpus=[
            GpuOut(
                index=g.index,
                name=g.name,
                memory_total_mb=g.memory_total_mb,
                memory_used_mb=g.memory_used_mb,
                utilization_percent=g.utilization_percent,
            )
            for g in gpus
        ],
        gpu_summary=GpuSummary(
            count=len(gpus),
            memory_total_mb=sum(g.memory_total_mb for g in gpus),
            memory_used_mb=sum(g.memory_used_mb for g in gpus),
            average_utilization_percent=None if average is None else round(average, 1),
        ),
        models=list(row.models or ()),
        connected_at=row.connected_at,
        last_heartbeat_at=row.last_heartbeat_at,
        created_at=row.created_at,
    )


def deployment_out(row: AgentDeployment, agent_name: str) -> DeploymentOut:
    return DeploymentOut(
        id=row.id,
        agent_id=row.agent_id,
        agent_name=agent_name,
        model_id=row.model_id,
        status=row.status,
        progress=row.progress,
        message=row.message,
        port=row.port,
        error=row.error,
        backend_name=row.backend_name,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
    )
