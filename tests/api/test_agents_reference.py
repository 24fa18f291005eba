"""The reference agent (``python -m app.agent``) end to end against a live panel.

It runs as a real subprocess; the model servers it starts are real processes too
(``python -m app.fakes --kind openai``), reached by the panel over loopback. The
machine has no ``nvidia-smi``: the agent reports no GPUs (no telemetry).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.agent.processes import build_argv
from app.agent.telemetry import parse_nvidia_smi
from app.domain.agents.backends import backend_name
from app.lib.settings import Settings
from tests.support.agents import (
    ADMIN,
    Panel,
    agents_settings,
    panel,
    project_sdk,
    run_agent,
    serve_panel,
)
from tests.support.api import eventually
from tests.support.settings import AppFactory

__all__ = ["agents_settings", "panel"]


def _model(tag: str) -> str:
    return f"org/{tag}-{uuid.uuid4().hex[:6]}"


def _pids_serving(port: int) -> list[int]:
    """Live processes whose command line is a fake server on ``port``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if b"app.fakes" in argv and str(port).encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "agent.log"
    yield path
    if path.exists():
        sys.stdout.write(path.read_text(errors="replace")[-4000:])


def test_the_command_template_is_split_before_substitution() -> None:
    argv = build_argv("vllm serve {model} --port {port} --name 'a b'", "org/m; rm -rf /", 8001)
    assert argv == ["vllm", "serve", "org/m; rm -rf /", "--port", "8001", "--name", "a b"]


def test_nvidia_smi_rows_are_parsed() -> None:
    gpus = parse_nvidia_smi("0, NVIDIA A100, 81920, 1024, 35\n1, NVIDIA A100, 81920, [N/A], 7\nbad")
    assert [(g.index, g.memory_used_mb, g.utilization_percent) for g in gpus] == [
        (0, 1024, 35.0),
        (1, 0, 7.0),
    ]


async def test_the_reference_agent_deploys_serves_and_stops_a_model(
    panel: Panel, log: Path
) -> None:
    agent_id, token = await panel.create_agent()
    model = _model("served")
    with run_agent(panel.url, token, log):
        await panel.wait_online(agent_id, within=15.0)
        shown = await panel.agent(agent_id)
        assert shown["host"] == "127.0.0.1"
        assert shown["gpus"] == []  # no nvidia-smi here: no telemetry
        assert shown["version"]

        response = await panel.deploy(model, agent_id)
        assert response.status_code == 202, response.text
        deployment = await panel.wait_deployment(response.json()["id"], "running", within=30.0)
        port = deployment["port"]
        assert deployment["progress"] == 100
        [server] = _pids_serving(port)
        await panel.wait_healthy(backend_name(model))
        async with await project_sdk(panel) as sdk:
            reply = await sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hello"}]
            )
        assert reply.choices[0].message.content

        async def listed() -> bool:
            return model in (await panel.agent(agent_id))["models"]

        await eventually(listed, within=5.0, interval=0.1)

        stop = await panel.http.post(
            f"/api/admin/agent-deployments/{deployment['id']}/stop", headers=ADMIN
        )
        assert stop.status_code == 202, stop.text
        await panel.wait_deployment(deployment["id"], "stopped", within=15.0)
        assert server not in _pids_serving(port)
        assert _pids_serving(port) == []
        assert (await panel.backend(backend_name(model))).status_code == 404


async def test_failures_are_reported_with_their_reason(panel: Panel, log: Path) -> None:
    agent_id, token = await panel.create_agent()
    exits = f"{sys.executable} -c \"print('no GPU for {{model}}'); raise SystemExit(3)\""
    with run_agent(panel.url, token, log, command=exits):
        await panel.wait_online(agent_id, within=15.0)
        deployment = (await panel.deploy("org/doomed", agent_id)).json()
        failed = await panel.wait_deployment(deployment["id"], "failed", within=20.0)
        assert "exited with code 3" in failed["error"]
        assert "no GPU for org/doomed" in failed["error"]

    agent_id, token = await panel.create_agent()
    silent = f'{sys.executable} -c "import time; time.sleep(60)"'
    with run_agent(panel.url, token, log, "--ready-timeout", "1", command=silent):
        await panel.wait_online(agent_id, within=15.0)
        deployment = (await panel.deploy("org/silent", agent_id)).json()
        failed = await panel.wait_deployment(deployment["id"], "failed", within=20.0)
        assert "did not answer" in failed["error"]
        assert "within 1 s" in failed["error"]


async def test_the_agent_reconnects_and_stops_its_servers_on_exit(
    agents_settings: Settings, make_app: AppFactory, log: Path
) -> None:
    model = _model("survivor")
    async with contextlib.AsyncExitStack() as first_panel:
        first = await first_panel.enter_async_context(serve_panel(make_app(agents_settings)))
        agent_id, token = await first.create_agent()
        port = int(first.url.rsplit(":", 1)[1])
        with run_agent(first.url, token, log) as process:
            await first.wait_online(agent_id, within=15.0)
            deployment = (await first.deploy(model, agent_id)).json()
            running = await first.wait_deployment(deployment["id"], "running", within=30.0)
            server_port = running["port"]
            # The panel goes away under the connected agent, and comes back.
            await first_panel.aclose()
            async with serve_panel(make_app(agents_settings), port=port) as second:
                await second.wait_online(agent_id, within=15.0)
                # The model server kept running through the outage.
                assert _pids_serving(server_port)
                assert (await second.deployment(deployment["id"]))["status"] == "running"
                await second.wait_healthy(backend_name(model))
                # SIGTERM: the agent stops every server it started, then exits 0.
                process.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(process.wait, 15) == 0
                assert _pids_serving(server_port) == []
                await second.wait_online(agent_id, online=False)
