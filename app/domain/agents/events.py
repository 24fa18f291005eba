"""What the agents area publishes on the ``agents`` channel (dashboards follow it).

Event shapes (the bus adds ``channel``)::

    {"kind": "agent", "agent_id"}                      registered, heartbeat, gone
    {"kind": "deployment", "agent_id", "deployment_id", "model_id", "status", "progress"}

Events are hints: a page re-reads the database on each one.
"""

from __future__ import annotations

from uuid import UUID

import structlog

from app.db.models import AgentDeployment
from app.lib.events.base import EventBus

CHANNEL = "agents"
logger = structlog.get_logger()


async def agent_changed(bus: EventBus, agent_id: UUID) -> None:
    await _publish(bus, {"kind": "agent", "agent_id": str(agent_id)})


async def deployment_changed(bus: EventBus, row: AgentDeployment) -> None:
    await _publish(
        bus,
        {
            "kind": "deployment",
            "agent_id": str(row.agent_id),
            "deployment_id": str(row.id),
            "model_id": row.model_id,
            "status": row.status,
            "progress": row.progress,
        },
    )


async def _publish(bus: EventBus, event: dict[str, object]) -> None:
    try:
        await bus.publish(CHANNEL, event)
    except Exception as exc:  # a hint for dashboards: the write itself has succeeded
        logger.warning("could not publish an agent event", error=repr(exc))
