"""Agents across replicas and restarts: two panels on one PostgreSQL database and one
Redis (the socket on one, the admin request on the other), a command no replica
picks up, and state that outlives a panel restart."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from sqlalchemy import update
from websockets.exceptions import ConnectionClosed

from app.db.models import AgentNode
from app.domain.agents.backends import backend_name
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.clock import utcnow
from app.lib.settings import Settings
from tests.support.agents import (
    ADMIN,
    Panel,
    agents_settings,
    fake_agent,
    gpu,
    panel,
    project_sdk,
    serve_panel,
)
from tests.support.api import eventually
from tests.support.auth import execute
from tests.support.helpers import assert_error
from tests.support.settings import AppFactory

__all__ = ["agents_settings", "panel"]


async def test_a_deploy_asked_on_one_replica_reaches_the_socket_on_the_other(
    agents_settings: Settings, make_app: AppFactory
) -> None:
    model = f"org/replicated-{uuid.uuid4().hex[:6]}"
    fake = FakeOpenAI("replicated", models=[model])
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(serve_asgi(fake))
        a = await stack.enter_async_context(serve_panel(make_app(agents_settings)))
        b = await stack.enter_async_context(serve_panel(make_app(agents_settings)))
        agent_id, token = await b.create_agent()
        agent = await stack.enter_async_context(fake_agent(a, token, gpus=[gpu(5.0)]))
        assert uuid.UUID(agent_id) in a.resources.agents.hub
        assert uuid.UUID(agent_id) not in b.resources.agents.hub
        assert (await b.agent(agent_id))["online"] is True

        response = await b.deploy(model, agent_id)
        assert response.status_code == 202, response.text
        deployment = response.json()
        assert await agent.expect("deploy") == {"type": "deploy", "model_id": model}
        port = int(url.rsplit(":", 1)[1])
        await agent.send({"type": "deploy_result", "model_id": model, "ok": True, "port": port})
        # Written by A (which holds the socket), read on B; B routes to it.
        await b.wait_deployment(deployment["id"], "running")
        await b.wait_healthy(backend_name(model))
        async with await project_sdk(b) as sdk:
            reply = await sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
        assert reply.choices[0].message.content

        # Stop asked on B, answered through A.
        stop = await b.http.post(
            f"/api/admin/agent-deployments/{deployment['id']}/stop", headers=ADMIN
        )
        assert stop.status_code == 202, stop.text
        await agent.expect("stop")
        await agent.send({"type": "stop_result", "model_id": model, "ok": True})
        await b.wait_deployment(deployment["id"], "stopped")

        async def gone_on_b() -> bool:
            return b.resources.backend_registry.get(backend_name(model)) is None

        await eventually(gone_on_b, within=5.0)

        # Deleting the identity on B closes the socket held by A.
        assert (
            await b.http.delete(f"/api/admin/agents/{agent_id}", headers=ADMIN)
        ).status_code == 204
        with pytest.raises(ConnectionClosed):
            await agent.recv()
        assert agent.ws.close_code == 1008
        assert agent.ws.close_reason == "agent identity deleted"


async def test_a_command_no_replica_picks_up_times_out_with_a_clear_error(panel: Panel) -> None:
    agent_id, _ = await panel.create_agent()
    # Online by its heartbeat, but no replica holds a socket for it (its replica died).
    await execute(
        panel.resources.settings,
        update(AgentNode)
        .where(AgentNode.id == uuid.UUID(agent_id))
        .values(connection_id="gone", last_heartbeat_at=utcnow(), host="10.0.0.9"),
    )
    panel.resources.agents.hub.command_timeout = 0.3
    response = await panel.deploy("org/nobody-home", agent_id)
    error = assert_error(response, 503, "agent_unreachable")
    assert "no replica delivered the command" in error["message"]
    listed = await panel.http.get(
        "/api/admin/agent-deployments", params={"agentId": agent_id}, headers=ADMIN
    )
    [row] = listed.json()["items"]
    assert row["status"] == "failed"
    assert row["error"] == error["message"]
    # Not left online for ever: its heartbeat ages out like any other.
    await execute(
        panel.resources.settings,
        update(AgentNode).where(AgentNode.id == uuid.UUID(agent_id)).values(connection_id=None),
    )


async def test_agents_and_deployments_outlive_a_restart(
    agents_settings: Settings, make_app: AppFactory
) -> None:
    model = f"org/durable-{uuid.uuid4().hex[:6]}"
    fake = FakeOpenAI("durable", models=[model])
    async with serve_asgi(fake) as url, contextlib.AsyncExitStack() as agents:
        async with serve_panel(make_app(agents_settings)) as first:
            agent_id, token = await first.create_agent()
            port = int(first.url.rsplit(":", 1)[1])
            # Entered on the outer stack: the panel stops while the agent is connected.
            agent = await agents.enter_async_context(fake_agent(first, token, gpus=[gpu(33.0)]))
            deployment = (await first.deploy(model, agent_id)).json()
            await agent.expect("deploy")
            await agent.send(
                {
                    "type": "deploy_result",
                    "model_id": model,
                    "ok": True,
                    "port": int(url.rsplit(":", 1)[1]),
                }
            )
            await first.wait_deployment(deployment["id"], "running")
            await agent.heartbeat(gpus=[gpu(33.0)], models=[model])
            await agent.sync()
        with pytest.raises(ConnectionClosed):
            await agent.recv()
        assert agent.ws.close_code in (1001, 1012)

        async with serve_panel(make_app(agents_settings), port=port) as second:
            shown = await second.agent(agent_id)
            assert shown["online"] is False
            assert shown["gpuSummary"]["averageUtilizationPercent"] == 33.0
            assert shown["models"] == [model]
            again = await second.deployment(deployment["id"])
            assert again["status"] == "running"
            await second.wait_healthy(backend_name(model))
            async with fake_agent(second, token, gpus=[gpu(12.0)]) as back:
                assert (await second.agent(agent_id))["online"] is True
                await back.heartbeat(gpus=[gpu(12.0)], models=[model])
                await back.sync()
                assert (await second.deployment(deployment["id"]))["status"] == "running"
