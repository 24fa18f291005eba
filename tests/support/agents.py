"""Fixtures and helpers for the GPU agent tests: live panels (uvicorn on loopback
ports, PostgreSQL + Redis of their own) and raw-WebSocket test agents.

The panel runs in the test's own event loop, so tests may reach into its resources.
A ``FakeAgent`` speaks the ``/ws/agent`` protocol frame by frame with the
``websockets`` client; the reference agent (``app.agent``) is tested separately.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from litestar import Litestar
from websockets.asyncio.client import ClientConnection, connect

from app.lib.ports import free_port
from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.helpers import bearer, new_project, new_user
from tests.support.live_server import LiveApp, live_server
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "agents-admin-" + "a" * 32
ADMIN = bearer(ADMIN_TOKEN)
FRAME_TIMEOUT = 5.0
GPU_A100 = {
    "index": 0,
    "name": "NVIDIA A100",
    "memory_total_mb": 81920,
    "memory_used_mb": 1024,
    "utilization_percent": 20.0,
}


def unique(tag: str = "agent") -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def gpu(utilization: float, index: int = 0, used: int = 1024) -> dict[str, Any]:
    return {**GPU_A100, "index": index, "utilization_percent": utilization, "memory_used_mb": used}


@pytest.fixture(scope="module")
async def agents_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("agents")) as settings:
        yield with_settings(settings, admin_token=ADMIN_TOKEN, health_interval_seconds=0.5)


@dataclass
class Panel(LiveApp):
    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/ws/agent"

    async def create_agent(self, name: str | None = None) -> tuple[str, str]:
        """A new identity: (agent id, token)."""
        response = await self.http.post(
            "/api/admin/agents", json={"name": name or unique()}, headers=ADMIN
        )
        assert response.status_code == 201, response.text
        body = response.json()
        return body["id"], body["token"]

    async def agent(self, agent_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/api/admin/agents/{agent_id}", headers=ADMIN)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def deploy(self, model_id: str, agent_id: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"modelId": model_id}
        if agent_id is not None:
            body["agentId"] = agent_id
        return await self.http.post("/api/admin/agent-deployments", json=body, headers=ADMIN)

    async def deployment(self, deployment_id: str) -> dict[str, Any]:
        response = await self.http.get(
            f"/api/admin/agent-deployments/{deployment_id}", headers=ADMIN
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def wait_deployment(
        self, deployment_id: str, status: str, within: float = 5.0
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        async def reached() -> bool:
            last.update(await self.deployment(deployment_id))
            return bool(last["status"] == status)

        await eventually(reached, within=within, interval=0.05)
        return last

    async def wait_online(self, agent_id: str, online: bool = True, within: float = 5.0) -> None:
        async def reached() -> bool:
            return bool((await self.agent(agent_id))["online"] == online)

        await eventually(reached, within=within, interval=0.05)

    async def backend(self, name: str) -> httpx.Response:
        return await self.http.get(f"/api/admin/backends/{name}", headers=ADMIN)

    async def wait_healthy(self, name: str, within: float = 5.0) -> dict[str, Any]:
        last: dict[str, Any] = {}

        async def healthy() -> bool:
            response = await self.backend(name)
            if response.status_code != 200:
                return False
            last.update(response.json())
            return bool(last["health"]["status"] == "healthy")

        await eventually(healthy, within=within, interval=0.05)
        return last


@contextlib.asynccontextmanager
async def serve_panel(app: Litestar, port: int | None = None) -> AsyncIterator[Panel]:
    """Like ``tests.support.live_server`` but on a chosen port (a restarted panel keeps its
    address, as agents expect). By default a port below the ephemeral range, so that
    no connection takes it while the panel is down (an agent reconnecting to it could
    even connect to itself on an ephemeral one)."""
    async with (
        live_server(app, free_port() if port is None else port) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        yield Panel(url=url, app=app, http=http)


@pytest.fixture
async def panel(agents_settings: Settings, make_app: AppFactory) -> AsyncIterator[Panel]:
    async with serve_panel(make_app(agents_settings)) as live:
        yield live


class FakeAgent:
    """A test agent speaking the protocol by hand over a real WebSocket."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(msgspec.json.encode(frame).decode())

    async def recv(self, within: float = FRAME_TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(within):
            message = await self.ws.recv()
        frame: dict[str, Any] = msgspec.json.decode(message)
        return frame

    async def expect(self, kind: str, within: float = FRAME_TIMEOUT) -> dict[str, Any]:
        frame = await self.recv(within)
        assert frame["type"] == kind, frame
        return frame

    async def nothing_within(self, seconds: float) -> None:
        """No frame arrives for ``seconds`` (the command went elsewhere)."""
        with contextlib.suppress(TimeoutError):
            frame = await self.recv(seconds)
            raise AssertionError(f"unexpected frame {frame}")

    async def register(
        self, *, gpus: list[dict[str, Any]] | None = None, host: str = "127.0.0.1"
    ) -> dict[str, Any]:
        await self.send(
            {
                "type": "register",
                "machine_name": "gpu-box",
                "version": "9.9.9",
                "host": host,
                "gpus": gpus or [],
            }
        )
        return await self.expect("registered")

    async def heartbeat(
        self, *, gpus: list[dict[str, Any]] | None = None, models: list[str] | None = None
    ) -> None:
        await self.send({"type": "heartbeat", "gpus": gpus or [], "models": models or []})

    async def sync(self) -> None:
        """Round-trip a frame the panel answers, so everything sent before is handled."""
        await self.send({"type": "deploy_progress", "model_id": "__sync__", "progress": 0})
        frame = await self.expect("error")
        assert frame["code"] == "unknown_deployment", frame


@contextlib.asynccontextmanager
async def fake_agent(
    panel: Panel, token: str, *, gpus: list[dict[str, Any]] | None = None, register: bool = True
) -> AsyncIterator[FakeAgent]:
    async with connect(panel.ws_url, additional_headers=bearer(token), open_timeout=5) as ws:
        agent = FakeAgent(ws)
        if register:
            await agent.register(gpus=gpus)
        yield agent


async def online_agent(
    stack: contextlib.AsyncExitStack, panel: Panel, *, gpus: list[dict[str, Any]] | None = None
) -> tuple[str, FakeAgent]:
    agent_id, token = await panel.create_agent()
    agent = await stack.enter_async_context(fake_agent(panel, token, gpus=gpus))
    if gpus is not None:
        await agent.heartbeat(gpus=gpus)
        await agent.sync()
    return agent_id, agent


FAKE_SERVER = f"{sys.executable} -m app.fakes --kind openai --port {{port}} --models {{model}}"
REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def run_agent(
    panel_url: str, token: str, log: Path, *extra: str, command: str = FAKE_SERVER
) -> Iterator[subprocess.Popen[bytes]]:
    """The reference agent as a subprocess (output appended to ``log``); SIGTERM on exit."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.agent",
                "--panel",
                panel_url,
                "--token",
                token,
                "--command",
                command,
                "--heartbeat-interval",
                "0.3",
                "--stop-grace",
                "5",
                *extra,
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def project_sdk(panel: Panel) -> openai.AsyncOpenAI:
    """An ``openai`` client with a new project's API key on ``panel``."""
    _, headers = await new_user(panel.http)  # type: ignore[arg-type]
    project = await new_project(panel.http, headers)  # type: ignore[arg-type]
    key = await panel.http.post(
        f"/api/projects/{project['id']}/api-keys", json={"name": "sdk"}, headers=headers
    )
    assert key.status_code == 201, key.text
    return openai.AsyncOpenAI(base_url=f"{panel.url}/v1", api_key=key.json()["key"], max_retries=0)
