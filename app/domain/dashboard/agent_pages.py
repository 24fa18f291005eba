"""The agents page: GPU agents with their online state, GPUs and versions, live deploy
progress (SSE), and the admin actions of ``/api/admin/agents`` and
``/api/admin/agent-deployments`` through the same services.

Routes::

    GET    /admin/agents                      the page
    POST   /admin/agents                      create an identity (the token shown once)
    DELETE /admin/agents/{id}                 delete it (its socket closes)
    POST   /admin/agent-deployments           deploy (an agent, or "least loaded")
    POST   /admin/agent-deployments/{id}/stop
    GET    /admin/stream/agents               text/event-stream (``AgentsFeed``, in ``pages``)
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
from litestar import delete, get, post
from litestar.response import Redirect, Response, Template

from app.domain.agents.schemas import AgentCreate, DeployIn
from app.domain.agents.services import AgentNodeService
from app.domain.agents.setup import Agents
from app.domain.dashboard.agent_views import agents_view
from app.domain.dashboard.common import (
    AdminRequest,
    DashboardController,
    notice,
    notify,
    text,
)
from app.domain.web.pages import WebUser
from app.lib.errors import AronaError

CREATE_TEMPLATE = "dashboard/partials/agent_create.html"
DEPLOY_TEMPLATE = "dashboard/partials/agent_deploy_form.html"
LEAST_LOADED = "least-loaded"


class AgentPages(DashboardController):
    @get("/agents")
    async def agents_page(self, admin: AdminRequest, agents: Agents) -> Template:
        view = await agents_view(admin.db_config, agents.offline_seconds)
        return admin.page(
            "dashboard/agents.html",
            "agents",
            view=view,
            values={},
            errors={},
            created=None,
            panel_url=_panel_url(admin),
        )

    @post("/agents", status_code=200)
    async def create_agent(
        self, admin: AdminRequest, agent_nodes_service: AgentNodeService
    ) -> Template | Redirect:
        values = {"name": text(await admin.form(), "name")}
        errors: dict[str, str] = {}
        if not values["name"]:
            errors["name"] = "Give the agent a name."
        else:
            try:
                data = msgspec.convert(values, AgentCreate)
                row, token = await agent_nodes_service.create_identity(data.name)
            except msgspec.ValidationError:
                errors["name"] = "Use 1-100 letters, digits, '.', '_' or '-', starting with one."
            except AronaError as exc:
                errors["name"] = exc.message
            else:
                return admin.saved(
                    "/admin/agents",
                    CREATE_TEMPLATE,
                    headers=notify(f"Agent {row.name} created.", "success", "agents-changed"),
                    values={},
                    errors={},
                    created={"name": row.name, "token": token},
                    panel_url=_panel_url(admin),
                )
        return admin.form_fragment(
            CREATE_TEMPLATE, values=values, errors=errors, created=None, panel_url=_panel_url(admin)
        )

    @delete("/agents/{agent_id:uuid}", status_code=200)
    async def delete_agent(
        self, agent_id: UUID, web_admin: WebUser, agents: Agents
    ) -> Response[str]:
        await agents.deployer.delete_identity(agent_id)
        return notice("Agent deleted; its connection was closed.")

    @post("/agent-deployments", status_code=200)
    async def deploy(self, admin: AdminRequest, agents: Agents) -> Template:
        form = await admin.form()
        chosen = text(form, "agent_id")
        values = {"model_id": text(form, "model_id"), "agent_id": chosen}
        errors: dict[str, str] = {}
        headers = None
        body: dict[str, Any] = {"modelId": values["model_id"]}
        if chosen and chosen != LEAST_LOADED:
            body["agentId"] = chosen
        if not values["model_id"]:
            errors["model_id"] = "Enter the model to deploy, such as Qwen/Qwen3-8B."
        else:
            try:
                data = msgspec.convert(body, DeployIn)
            except msgspec.ValidationError:
                errors["model_id"] = "A model id has no spaces and at most 200 characters."
            else:
                try:
                    row = await agents.deployer.deploy(data.model_id, data.agent_id)
                except AronaError as exc:
                    headers = notify(exc.message, "error", "agents-changed")
                else:
                    headers = notify(f"Deploying {row.model_id}.", "success", "agents-changed")
                    values = {"model_id": "", "agent_id": chosen}
        view = await agents_view(admin.db_config, agents.offline_seconds)
        return admin.form_fragment(
            DEPLOY_TEMPLATE, headers=headers, view=view, values=values, errors=errors
        )

    @post("/agent-deployments/{deployment_id:uuid}/stop", status_code=200)
    async def stop(self, deployment_id: UUID, web_admin: WebUser, agents: Agents) -> Response[str]:
        row = await agents.deployer.stop(deployment_id)
        return notice(f"Stopping {row.model_id}.")


def _panel_url(admin: AdminRequest) -> str:
    """The address agents dial (shown in the install command)."""
    return str(admin.request.base_url).rstrip("/")
