"""Deploying models on agents: choosing the agent, the backend a successful deploy
registers (and routes a chat to), redeploys, stops, failures, progress events.

Agents here are raw-WebSocket test agents; the model servers they "start" are real
fake OpenAI servers on loopback ports, whose port the test agent reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from typing import Any

from app.domain.agents.backends import backend_name
from app.domain.agents.events import CHANNEL
from app.domain.backends.schemas import NAME_PATTERN
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.agents import (
    ADMIN,
    FakeAgent,
    Panel,
    agents_settings,
    fake_agent,
    gpu,
    online_agent,
    panel,
    project_sdk,
)
from tests.support.api import eventually
from tests.support.helpers import assert_error

__all__ = ["agents_settings", "panel"]


def _model(tag: str = "model") -> str:
    return f"org/{tag}-{uuid.uuid4().hex[:6]}"


async def _chat(panel: Panel, model: str) -> str:
    async with await project_sdk(panel) as sdk:
        reply = await sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}]
        )
    assert reply.model == model
    return reply.choices[0].message.content or ""


async def _deployed(agent: FakeAgent, model: str) -> None:
    frame = await agent.expect("deploy")
    assert frame == {"type": "deploy", "model_id": model}


def test_backend_names_are_valid_and_distinct() -> None:
    assert backend_name("llama3") == "agent-llama3"
    slashed, dashed = backend_name("org/model"), backend_name("org-model")
    assert slashed.startswith("agent-org-model-")
    assert dashed == "agent-org-model"
    assert slashed != dashed
    long = backend_name("m" * 200)
    assert len(long) == 100
    assert long != backend_name("m" * 199)
    for name in (slashed, long, backend_name("a b:c@d")):
        assert re.match(NAME_PATTERN, name), name


async def test_least_loaded_online_agent_gets_the_deploy(panel: Panel) -> None:
    async with contextlib.AsyncExitStack() as stack:
        busy_id, busy = await online_agent(stack, panel, gpus=[gpu(80.0), gpu(60.0)])
        idle_id, idle = await online_agent(stack, panel, gpus=[gpu(20.0), gpu(40.0)])
        blind_id, blind = await online_agent(stack, panel, gpus=[])
        model = _model()

        response = await panel.deploy(model)
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["agentId"] == idle_id
        assert body["status"] == "deploying"
        assert body["modelId"] == model
        await _deployed(idle, model)
        await busy.nothing_within(0.2)
        await blind.nothing_within(0.1)

        # The idle one gets busier than the busy one: the choice follows.
        await idle.heartbeat(gpus=[gpu(95.0)])
        await idle.sync()
        response = await panel.deploy(_model())
        assert response.json()["agentId"] == busy_id, response.text
        await busy.expect("deploy")

        # Agents with telemetry gone: the one without telemetry is still a choice.
        await busy.ws.close()
        await idle.ws.close()
        await panel.wait_online(busy_id, online=False)
        await panel.wait_online(idle_id, online=False)
        response = await panel.deploy(_model())
        assert response.json()["agentId"] == blind_id, response.text
        await blind.expect("deploy")


async def test_an_explicit_agent_is_used_even_when_busier(panel: Panel) -> None:
    async with contextlib.AsyncExitStack() as stack:
        busy_id, busy = await online_agent(stack, panel, gpus=[gpu(99.0)])
        _, idle = await online_agent(stack, panel, gpus=[gpu(1.0)])
        model = _model()
        response = await panel.deploy(model, busy_id)
        assert response.status_code == 202, response.text
        assert response.json()["agentId"] == busy_id
        await _deployed(busy, model)
        await idle.nothing_within(0.2)

    offline_id, _ = await panel.create_agent()
    assert_error(await panel.deploy(_model(), offline_id), 409, "agent_offline")
    assert_error(await panel.deploy(_model(), str(uuid.uuid4())), 404, "agent_not_found")
    assert_error(
        await panel.http.post(
            "/api/admin/agent-deployments", json={"modelId": "has space"}, headers=ADMIN
        ),
        400,
    )


async def test_no_agent_online_is_a_clear_error(panel: Panel) -> None:
    # Other tests' agents share the database: none of them is connected now.
    response = await panel.deploy(_model())
    error = assert_error(response, 503, "no_agent_online")
    assert "arona agent" in error["message"]


async def test_a_deployed_model_is_routed_then_replaced_then_stopped(panel: Panel) -> None:
    model = _model("served")
    name = backend_name(model)
    first_fake = FakeOpenAI("agent-first", models=[model])
    second_fake = FakeOpenAI("agent-second", models=[model])
    async with contextlib.AsyncExitStack() as stack:
        first_url = await stack.enter_async_context(serve_asgi(first_fake))
        second_url = await stack.enter_async_context(serve_asgi(second_fake))
        agent_id, agent = await online_agent(stack, panel, gpus=[gpu(10.0)])
        events = await stack.enter_async_context(panel.resources.event_bus.subscribe(CHANNEL))

        deployment = (await panel.deploy(model, agent_id)).json()
        await _deployed(agent, model)
        await agent.send(
            {"type": "deploy_progress", "model_id": model, "progress": 40, "message": "loading"}
        )
        await agent.sync()
        shown = await panel.deployment(deployment["id"])
        assert (shown["status"], shown["progress"], shown["message"]) == (
            "deploying",
            40,
            "loading",
        )
        port = int(first_url.rsplit(":", 1)[1])
        await agent.send({"type": "deploy_result", "model_id": model, "ok": True, "port": port})
        running = await panel.wait_deployment(deployment["id"], "running")
        assert running["port"] == port
        assert running["progress"] == 100
        assert running["backendName"] == name
        backend = await panel.wait_healthy(name)
        assert backend["type"] == "external"
        assert backend["url"] == first_url
        assert backend["models"] == [model]
        assert await _chat(panel, model)
        assert any(r.path.endswith("/chat/completions") for r in first_fake.requests)

        # Progress reached dashboards over the bus.
        seen: list[dict[str, Any]] = []

        async def collect() -> None:
            async for event in events:
                seen.append(event)

        # One reader for the whole wait: a read cancelled mid-way by a timeout could
        # lose the event it was receiving.
        collector = asyncio.create_task(collect())

        async def got_running() -> bool:
            return any(e.get("status") == "running" for e in seen)

        try:
            await eventually(got_running, within=10.0)
        finally:
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
        assert any(e.get("progress") == 40 for e in seen), seen

        # Deploying again replaces the backend.
        again = (await panel.deploy(model, agent_id)).json()
        await _deployed(agent, model)
        assert (await panel.deployment(deployment["id"]))["status"] == "stopped"
        port = int(second_url.rsplit(":", 1)[1])
        await agent.send({"type": "deploy_result", "model_id": model, "ok": True, "port": port})
        await panel.wait_deployment(again["id"], "running")
        backend = await panel.wait_healthy(name)
        assert backend["url"] == second_url
        await agent.heartbeat(gpus=[gpu(10.0)], models=[model])
        await agent.sync()
        assert await _chat(panel, model)
        assert any(r.path.endswith("/chat/completions") for r in second_fake.requests)

        # Stop: stopping, the agent is told, its answer unregisters the backend.
        stopping = await panel.http.post(
            f"/api/admin/agent-deployments/{again['id']}/stop", headers=ADMIN
        )
        assert stopping.status_code == 202, stopping.text
        assert stopping.json()["status"] == "stopping"
        assert await agent.expect("stop") == {"type": "stop", "model_id": model}
        await agent.send({"type": "stop_result", "model_id": model, "ok": True})
        stopped = await panel.wait_deployment(again["id"], "stopped")
        assert stopped["finishedAt"] is not None
        assert (await panel.backend(name)).status_code == 404
        assert_error(
            await panel.http.post(
                f"/api/admin/agent-deployments/{again['id']}/stop", headers=ADMIN
            ),
            409,
            "deployment_not_active",
        )
        listed = await panel.http.get(
            "/api/admin/agent-deployments", params={"agentId": agent_id}, headers=ADMIN
        )
        assert [d["status"] for d in listed.json()["items"]] == ["stopped", "stopped"]


async def test_a_failed_deploy_keeps_its_error_and_registers_nothing(panel: Panel) -> None:
    model = _model("broken")
    async with contextlib.AsyncExitStack() as stack:
        agent_id, agent = await online_agent(stack, panel, gpus=[gpu(10.0)])
        deployment = (await panel.deploy(model, agent_id)).json()
        await _deployed(agent, model)
        await agent.send(
            {
                "type": "deploy_result",
                "model_id": model,
                "ok": False,
                "error": "CUDA out of memory",
            }
        )
        failed = await panel.wait_deployment(deployment["id"], "failed")
        assert failed["error"] == "CUDA out of memory"
        assert failed["finishedAt"] is not None
        assert (await panel.backend(backend_name(model))).status_code == 404
        # A late result for it is refused, not applied.
        await agent.send({"type": "deploy_result", "model_id": model, "ok": True, "port": 1})
        assert (await agent.expect("error"))["code"] == "unknown_deployment"
        assert (await panel.deployment(deployment["id"]))["status"] == "failed"
        filtered = await panel.http.get(
            "/api/admin/agent-deployments",
            params={"agentId": agent_id, "status": "failed"},
            headers=ADMIN,
        )
        assert [d["id"] for d in filtered.json()["items"]] == [deployment["id"]]


async def test_a_model_the_agent_no_longer_serves_is_marked_stopped(panel: Panel) -> None:
    model = _model("vanished")
    fake = FakeOpenAI("agent-vanished", models=[model])
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(serve_asgi(fake))
        agent_id, agent = await online_agent(stack, panel, gpus=[gpu(10.0)])
        deployment = (await panel.deploy(model, agent_id)).json()
        await _deployed(agent, model)
        port = int(url.rsplit(":", 1)[1])
        await agent.send({"type": "deploy_result", "model_id": model, "ok": True, "port": port})
        await panel.wait_deployment(deployment["id"], "running")
        await agent.heartbeat(models=[model])
        await agent.sync()
        assert (await panel.deployment(deployment["id"]))["status"] == "running"
        # The agent restarted and lost the server: its heartbeat no longer lists it.
        await agent.heartbeat(models=[])
        stopped = await panel.wait_deployment(deployment["id"], "stopped")
        assert stopped["error"] == "the agent no longer serves this model"
        assert (await panel.backend(backend_name(model))).status_code == 404


async def test_stopping_needs_an_online_agent_and_a_failed_stop_keeps_it_running(
    panel: Panel,
) -> None:
    model = _model("stubborn")
    fake = FakeOpenAI("agent-stubborn", models=[model])
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(serve_asgi(fake))
        agent_id, token = await panel.create_agent()
        async with fake_agent(panel, token, gpus=[gpu(1.0)]) as agent:
            deployment = (await panel.deploy(model, agent_id)).json()
            await _deployed(agent, model)
            port = int(url.rsplit(":", 1)[1])
            await agent.send({"type": "deploy_result", "model_id": model, "ok": True, "port": port})
            await panel.wait_deployment(deployment["id"], "running")
            stop = f"/api/admin/agent-deployments/{deployment['id']}/stop"
            assert (await panel.http.post(stop, headers=ADMIN)).status_code == 202
            await agent.expect("stop")
            await agent.send(
                {"type": "stop_result", "model_id": model, "ok": False, "error": "EPERM"}
            )
            kept = await panel.wait_deployment(deployment["id"], "running")
            assert kept["error"] == "stop failed: EPERM"
            await panel.wait_healthy(backend_name(model))
        await panel.wait_online(agent_id, online=False)
        assert_error(await panel.http.post(stop, headers=ADMIN), 409, "agent_offline")
        assert_error(
            await panel.http.post(
                f"/api/admin/agent-deployments/{uuid.uuid4()}/stop", headers=ADMIN
            ),
            404,
            "deployment_not_found",
        )
        # Deleting the identity drops the backends of its deployments.
        assert (
            await panel.http.delete(f"/api/admin/agents/{agent_id}", headers=ADMIN)
        ).status_code == 204
        assert (await panel.backend(backend_name(model))).status_code == 404


async def test_deployment_filters(panel: Panel) -> None:
    response = await panel.http.get(
        "/api/admin/agent-deployments", params={"agentId": str(uuid.uuid4())}, headers=ADMIN
    )
    assert response.status_code == 200
    assert response.json()["items"] == []
    bad = await panel.http.get(
        "/api/admin/agent-deployments", params={"status": "exploded"}, headers=ADMIN
    )
    assert_error(bad, 400)
