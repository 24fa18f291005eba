"""Deploy and stop models on agents, and delete agent identities (admin actions).

Used by the admin API and the dashboard alike. A command goes to the agent through
``AgentHub`` (whichever replica holds its socket); the agent's answers arrive on
that replica's socket (``app.domain.agents.sessions``) and update the same rows.
"""

from __future__ import annotations

from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import AgentDeployment, AgentNode
from app.domain.agents import events
from app.domain.agents.backends import AgentBackends
from app.domain.agents.hub import AgentHub
from app.domain.agents.schemas import ACTIVE_STATUSES
from app.domain.agents.services import (
    AgentDeploymentService,
    AgentNodeService,
    is_online,
    load_key,
)
from app.lib.agent_frames import Deploy, Stop
from app.lib.clock import utcnow
from app.lib.errors import ConflictError, ServiceUnavailableError
from app.lib.events.base import EventBus


def no_agent_online() -> ServiceUnavailableError:
    return ServiceUnavailableError(
        "no agent is online: start one with `arona agent --panel URL --token T`",
        code="no_agent_online",
    )


def agent_offline(name: str) -> ConflictError:
    return ConflictError(
        f"agent {name} is offline (no heartbeat within the offline window)",
        code="agent_offline",
        param="agentId",
    )


def unreachable(name: str, seconds: float) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"agent {name} looks online but no replica delivered the command within "
        f"{seconds:g} s; it may be reconnecting: try again shortly",
        code="agent_unreachable",
    )


class AgentDeployer:
    def __init__(
        self,
        *,
        db_config: SQLAlchemyAsyncConfig,
        hub: AgentHub,
        backends: AgentBackends,
        bus: EventBus,
        offline_seconds: float,
    ) -> None:
        self._db_config = db_config
        self._hub = hub
        self._backends = backends
        self._bus = bus
        self.offline_seconds = offline_seconds

    async def choose(self, agent_id: UUID | None) -> AgentNode:
        """The agent asked for (it must be online), else the least loaded online one."""
        async with AgentNodeService.new(config=self._db_config) as agents:
            if agent_id is not None:
                agent = await agents.require(agent_id)
                if not is_online(agent, utcnow(), self.offline_seconds):
                    raise agent_offline(agent.name)
                return agent
            online = await agents.online(self.offline_seconds)
        if not online:
            raise no_agent_online()
        return min(online, key=load_key)

    async def deploy(self, model_id: str, agent_id: UUID | None = None) -> AgentDeployment:
        agent = await self.choose(agent_id)
        async with AgentDeploymentService.new(config=self._db_config) as deployments:
            row, resync = await deployments.start(agent.id, model_id)
        for model in resync:
            await self._backends.sync(model)
        await events.deployment_changed(self._bus, row)
        if not await self._hub.send(agent.id, Deploy(model_id=model_id)):
            await self._undelivered(row, "failed", agent.name)
        return row

    async def stop(self, deployment_id: UUID) -> AgentDeployment:
        async with AgentDeploymentService.new(config=self._db_config) as deployments:
            row = await deployments.require(deployment_id)
            if row.status not in ACTIVE_STATUSES:
                raise ConflictError(
                    f"this deployment is {row.status}: there is nothing to stop",
                    code="deployment_not_active",
                )
            async with AgentNodeService.new(config=self._db_config) as agents:
                agent = await agents.require(row.agent_id)
            if not is_online(agent, utcnow(), self.offline_seconds):
                raise agent_offline(agent.name)
            previous = row.status
            row = await deployments.save(row, status="stopping", message="stopping")
        await events.deployment_changed(self._bus, row)
        if not await self._hub.send(agent.id, Stop(model_id=row.model_id)):
            await self._undelivered(row, previous, agent.name)
        return row

    async def _undelivered(self, row: AgentDeployment, status: str, agent_name: str) -> None:
        error = unreachable(agent_name, self._hub.command_timeout)
        async with AgentDeploymentService.new(config=self._db_config) as deployments:
            fresh = await deployments.require(row.id)
            fresh = await deployments.save(fresh, status=status, error=error.message)
        await events.deployment_changed(self._bus, fresh)
        raise error

    async def delete_identity(self, agent_id: UUID) -> None:
        """Delete the identity, close its socket wherever it is, drop its backends."""
        async with AgentNodeService.new(config=self._db_config) as agents:
            agent = await agents.require(agent_id)
            async with AgentDeploymentService.new(config=self._db_config) as deployments:
                models = await deployments.active_models_of_agent(agent.id)
            await agents.delete(agent.id, auto_commit=True)
        await self._hub.disconnect(agent_id, "agent identity deleted")
        for model in models:
            await self._backends.sync(model)
        await events.agent_changed(self._bus, agent_id)
