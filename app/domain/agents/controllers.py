"""Admin API of the GPU agent cluster (platform admins only).

- ``POST /api/admin/agents`` ``{"name"}``: a new identity; the token is in this
  answer only. ``GET`` lists (with online state, GPUs, models, versions), ``GET
  /{id}`` reads one, ``DELETE /{id}`` deletes it and closes its socket on whichever
  replica holds it.
- ``POST /api/admin/agent-deployments`` ``{"modelId", "agentId"?}``: deploy on that
  agent (409 ``agent_offline``) or the least loaded online one (503
  ``no_agent_online``); 202 with the ``deploying`` row; progress follows on the
  ``agents`` channel and in ``GET``. 503 ``agent_unreachable`` when no replica
  delivered the command in time (the row is marked failed).
- ``GET /api/admin/agent-deployments?agentId=&status=``, ``GET /{id}``,
  ``POST /{id}/stop`` (202, ``stopping``; 409 ``deployment_not_active``).
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import msgspec
from litestar import delete, get, post
from litestar.params import QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_202_ACCEPTED, HTTP_204_NO_CONTENT

from app.domain.accounts.principals import Principal
from app.domain.agents.schemas import (
    AgentCreate,
    AgentCreated,
    AgentOut,
    DeployIn,
    DeploymentOut,
    DeploymentStatus,
)
from app.domain.agents.services import AgentDeploymentService, AgentNodeService
from app.domain.agents.setup import Agents
from app.domain.agents.views import agent_out, deployment_out
from app.domain.paging import Page, Paging
from app.domain.rest import AdminController
from app.lib.errors import ERRORS_OPT


async def _names(service: AgentNodeService, ids: set[UUID]) -> dict[UUID, str]:
    if not ids:
        return {}
    rows = await service.get_many(service.model_type.id.in_(ids))
    return {row.id: row.name for row in rows}


class AgentAdminController(AdminController):
    path = "/api/admin/agents"
    tags = ["admin: agents"]

    @post("/", status_code=HTTP_201_CREATED)
    async def create_agent(
        self,
        data: AgentCreate,
        platform_admin: Principal,
        agent_nodes_service: AgentNodeService,
        agents: Agents,
    ) -> AgentCreated:
        row, token = await agent_nodes_service.create_identity(data.name)
        out = agent_out(row, agents.offline_seconds)
        return AgentCreated(**msgspec.structs.asdict(out), token=token)

    @get("/")
    async def list_agents(
        self,
        platform_admin: Principal,
        agent_nodes_service: AgentNodeService,
        agents: Agents,
        paging: Paging,
    ) -> Page[AgentOut]:
        rows, total = await agent_nodes_service.page(paging.limit, paging.offset)
        return paging.page(rows, total, lambda row: agent_out(row, agents.offline_seconds))

    @get("/{agent_id:uuid}")
    async def get_agent(
        self,
        agent_id: UUID,
        platform_admin: Principal,
        agent_nodes_service: AgentNodeService,
        agents: Agents,
    ) -> AgentOut:
        return agent_out(await agent_nodes_service.require(agent_id), agents.offline_seconds)

    @delete("/{agent_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_agent(self, agent_id: UUID, platform_admin: Principal, agents: Agents) -> None:
        await agents.deployer.delete_identity(agent_id)


class AgentDeploymentController(AdminController):
    path = "/api/admin/agent-deployments"
    tags = ["admin: agents"]

    @post("/", status_code=HTTP_202_ACCEPTED, opt={ERRORS_OPT: (404,)})
    async def deploy(
        self,
        data: DeployIn,
        platform_admin: Principal,
        agent_nodes_service: AgentNodeService,
        agents: Agents,
    ) -> DeploymentOut:
        row = await agents.deployer.deploy(data.model_id, data.agent_id)
        names = await _names(agent_nodes_service, {row.agent_id})
        return deployment_out(row, names.get(row.agent_id, ""))

    @get("/")
    async def list_deployments(
        self,
        platform_admin: Principal,
        agent_deployments_service: AgentDeploymentService,
        agent_nodes_service: AgentNodeService,
        paging: Paging,
        agent_id: Annotated[UUID | None, QueryParameter(name="agentId")] = None,
        status: DeploymentStatus | None = None,
    ) -> Page[DeploymentOut]:
        rows, total = await agent_deployments_service.page(
            paging.limit, paging.offset, agent_id=agent_id, status=status
        )
        names = await _names(agent_nodes_service, {row.agent_id for row in rows})
        return paging.page(
            rows, total, lambda row: deployment_out(row, names.get(row.agent_id, ""))
        )

    @get("/{deployment_id:uuid}")
    async def get_deployment(
        self,
        deployment_id: UUID,
        platform_admin: Principal,
        agent_deployments_service: AgentDeploymentService,
        agent_nodes_service: AgentNodeService,
    ) -> DeploymentOut:
        row = await agent_deployments_service.require(deployment_id)
        names = await _names(agent_nodes_service, {row.agent_id})
        return deployment_out(row, names.get(row.agent_id, ""))

    @post("/{deployment_id:uuid}/stop", status_code=HTTP_202_ACCEPTED)
    async def stop(
        self,
        deployment_id: UUID,
        platform_admin: Principal,
        agent_nodes_service: AgentNodeService,
        agents: Agents,
    ) -> DeploymentOut:
        row = await agents.deployer.stop(deployment_id)
        names = await _names(agent_nodes_service, {row.agent_id})
        return deployment_out(row, names.get(row.agent_id, ""))
