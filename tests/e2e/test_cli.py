"""The ``arona`` command as an operator runs it: real processes, real ports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from tests.conftest import JWT_SECRET

ARONA = str(Path(sys.executable).parent / "arona")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARONA_")}
    env["ARONA_DATA_DIR"] = str(tmp_path / "data")
    env["ARONA_LOG_LEVEL"] = "WARNING"
    env.update(extra)
    return env


def _run(
    args: list[str], env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ARONA, *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Demo(NamedTuple):
    base: str
    api_key: str
    project_id: str
    runtime_token: str
    output: str
    process: subprocess.Popen[str]


FREE_PORTS = ["--port", "0", "--upstream-port", "0", "--pool-port", "0", "--engine-port", "0"]
POOL = {"vllm-a": ["general"], "vllm-b": ["general", "smart"], "vllm-c": ["general", "smart"]}


def _output_of(process: subprocess.Popen[str], seen: list[str]) -> str:
    """What the demo printed so far, and the rest once it is stopped."""
    if process.poll() is None:
        process.kill()
    rest, _ = process.communicate(timeout=20)
    return "".join(seen) + (rest or "")


@contextlib.contextmanager
def _demo(tmp_path: Path) -> Iterator[Demo]:
    """``arona demo`` with every port picked free by the demo itself (a port chosen here
    could be taken by another socket before the demo binds it), until the block exits."""
    process = subprocess.Popen(
        [ARONA, "demo", *FREE_PORTS],
        env=_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            output.append(line)
            if "/api/runtime/me" in line:  # the banner's last line
                break
        text = "".join(output)
        health = re.search(r"health\s+(http://127\.0\.0\.1:\d+)/healthz", text)
        key = re.search(r"demo API key\s+(ak-\S+)", text)
        project = re.search(r"demo project\s+(\S+)", text)
        runtime = re.search(r"runtime token\s+(\S+)", text)
        if not (health and key and project and runtime):
            pytest.fail(f"the demo printed no banner:\n{_output_of(process, output)}")
        base = health.group(1)
        while not _healthy(base):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the demo never turned healthy:\n{_output_of(process, output)}")
            time.sleep(0.1)
        yield Demo(base, key.group(1), project.group(1), runtime.group(1), text, process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[Demo]:
    with _demo(tmp_path) as demo:
        yield demo


def _admin_headers(base: str, tmp_path: Path) -> dict[str, str]:
    stored = json.loads((tmp_path / "data" / "demo.json").read_text())
    response = httpx.post(
        f"{base}/api/auth/login",
        json={"email": "admin@demo.arona.local", "password": stored["admin_password"]},
    )
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['accessToken']}"}


def _pool_backends(base: str, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{base}/api/admin/backends?limit=500", headers=headers)
    assert response.status_code == 200, response.text
    return {i["name"]: i for i in response.json()["items"] if i["name"] in POOL}


def test_demo_serves_and_the_printed_key_reaches_an_authenticated_endpoint(demo_server, tmp_path):
    base, key, project_id, *_ = demo_server
    response = httpx.get(
        f"{base}/api/projects/{project_id}", headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["slug"] == "demo"
    denied = httpx.get(
        f"{base}/api/projects/{project_id}", headers={"Authorization": "Bearer ak-wrong"}
    )
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == "invalid_api_key"
    # The embedded default keeps everything in the data dir (SQLite file + secrets).
    data = tmp_path / "data"
    assert (data / "arona.db").exists()
    assert oct((data / "demo.json").stat().st_mode & 0o777) == "0o600"


def _client_once_listed(base: str, key: str, model: str) -> openai.OpenAI:
    """An SDK client, once ``model`` is listed (its backend passed its first probe)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    deadline = time.monotonic() + 10
    while not [m for m in client.models.list().data if m.id == model]:
        assert time.monotonic() < deadline, f"{model} never turned healthy"
        time.sleep(0.1)
    return client


def test_demo_chat_works_out_of_the_box_with_the_openai_sdk(demo_server):
    base, key, *_ = demo_server
    # The bundled upstream is registered fail-closed and probed at start-up.
    client = _client_once_listed(base, key, "demo-chat")
    reply = client.chat.completions.create(
        model="demo-chat", messages=[{"role": "user", "content": "Hello"}]
    )
    assert "demo-upstream" in (reply.choices[0].message.content or "")
    stream = client.chat.completions.create(
        model="demo-chat", messages=[{"role": "user", "content": "Hello"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "demo-upstream" in text
    embedded = client.embeddings.create(model="demo-embed", input="hello")
    assert embedded.data[0].embedding


def test_demo_registers_the_reference_engine_and_chats_through_it(demo_server):
    base, key, *_ = demo_server
    assert re.search(
        r"CEP engine\s+ws://127\.0\.0\.1:\d+\s+\(backend demo-engine", demo_server.output
    )
    client = _client_once_listed(base, key, "demo-echo")
    reply = client.chat.completions.create(
        model="demo-echo", messages=[{"role": "user", "content": "ping over CEP"}]
    )
    assert "ping over CEP" in (reply.choices[0].message.content or "")
    stream = client.chat.completions.create(
        model="demo-echo", messages=[{"role": "user", "content": "streamed"}], stream=True
    )
    assert "streamed" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert client.embeddings.create(model="demo-echo-embed", input="hi").data[0].embedding


def test_engine_echo_command_serves_a_cep_handshake(tmp_path):
    process = subprocess.Popen(
        [ARONA, "engine-echo", "--port", "0", "--token", "t0k"],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        listening = re.search(r"listening on (ws://127\.0\.0\.1:\d+)", process.stdout.readline())
        assert listening

        async def handshake(token: str) -> dict[str, Any]:
            async with connect(listening.group(1)) as ws:
                await ws.send(
                    json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": 1,
                            "method": "Engine.Handshake",
                            "params": {
                                "token": token,
                                "engine": {"name": "test", "version": "0"},
                                "capabilities": {},
                            },
                        }
                    )
                )
                result: dict[str, Any] = json.loads(await ws.recv())["result"]
                return result

        accepted = asyncio.run(handshake("t0k"))
        assert accepted["ok"] is True
        assert accepted["protocol_version"] == 2
        refused = asyncio.run(handshake("wrong"))
        assert refused["ok"] is False
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=10)


def test_agent_command_requires_a_panel_and_a_token(tmp_path):
    result = subprocess.run(
        [ARONA, "agent"], env=_env(tmp_path), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "--panel" in result.stderr


def test_demo_stops_on_ctrl_c_with_a_goodbye_and_status_0(tmp_path):
    with _demo(tmp_path) as demo:
        assert httpx.get(f"{demo.base}/healthz", timeout=5).status_code == 200
        demo.process.send_signal(signal.SIGINT)
        rest, _ = demo.process.communicate(timeout=30)
    assert demo.process.returncode == 0, rest
    assert "Arona demo stopped" in rest, rest
    assert "Aborted" not in rest
    assert "Traceback" not in rest


def test_demo_on_a_taken_port_says_so_before_touching_its_data(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = _run(["demo", "--port", "0", "--engine-port", str(port)], _env(tmp_path))
    assert refused.returncode == 1, refused.stdout
    assert f"cannot listen on 127.0.0.1:{port} for the CEP engine" in refused.stderr
    assert "in use" in refused.stderr
    assert not (tmp_path / "data").exists()
    out_of_range = _run(["demo", "--port", "70000"], _env(tmp_path))
    assert out_of_range.returncode == 2
    assert "70000 is not in the range 0<=x<=65535" in out_of_range.stderr


def test_demo_admin_can_log_in(demo_server, tmp_path):
    base, *_ = demo_server
    output = (tmp_path / "data" / "demo.json").read_text()
    password = re.search(r'"admin_password": "([^"]+)"', output)
    assert password
    response = httpx.post(
        f"{base}/api/auth/login",
        json={"email": "admin@demo.arona.local", "password": password.group(1)},
    )
    assert response.status_code == 200, response.text
    me = httpx.get(
        f"{base}/api/auth/me", headers={"Authorization": f"Bearer {response.json()['accessToken']}"}
    )
    assert me.json()["isAdmin"] is True


def test_demo_runs_a_seeded_vllm_pool_with_tags_that_turns_healthy(demo_server, tmp_path):
    base, *_ = demo_server
    headers = _admin_headers(base, tmp_path)
    # Seeded through the operator's path: a vLLM backends file in the data dir.
    seeded = json.loads((tmp_path / "data" / "vllm-backends.json").read_text())
    urls = {entry["name"]: entry["url"] for entry in seeded["backends"]}
    assert set(urls) == set(POOL)
    for name, url in urls.items():
        assert f"{name:<8} {url}  tags {', '.join(POOL[name])}" in demo_server.output

    deadline = time.monotonic() + 15
    while True:
        pool = _pool_backends(base, headers)
        if len(pool) == 3 and all(b["health"]["status"] == "healthy" for b in pool.values()):
            break
        assert time.monotonic() < deadline, pool
        time.sleep(0.2)
    for name, shown in pool.items():
        assert shown["type"] == "vllm"
        assert shown["tags"] == POOL[name]
        assert shown["url"] == urls[name]
        assert shown["models"] == ["demo-llama"]
        assert shown["advertised_models"] == ["demo-llama"]
    # The two model profiles over the pool, inserted once.
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "arona.db")) as db:
        profiles = db.execute(
            "SELECT id, base_model, tags, fallback_profile_id, failover_chain "
            "FROM model_profiles ORDER BY id"
        ).fetchall()
    assert [(p[0], p[1], json.loads(p[2]), p[3], json.loads(p[4])) for p in profiles] == [
        ("llm", "demo-llama", [], None, []),
        ("llm-smart", "demo-llama", ["smart"], "llm", ["llm"]),
    ]


def test_the_printed_runtime_token_authenticates_the_runtime_api(demo_server):
    base, _, project_id, runtime_token, *_ = demo_server
    response = httpx.get(
        f"{base}/api/runtime/me", headers={"Authorization": f"Bearer {runtime_token}"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["projectId"] == project_id


def test_a_restarted_demo_keeps_its_credentials_and_pool(tmp_path):
    with _demo(tmp_path) as first:
        headers = _admin_headers(first.base, tmp_path)
        created = {n: b["created_at"] for n, b in _pool_backends(first.base, headers).items()}
    with _demo(tmp_path) as second:
        assert (second.api_key, second.runtime_token) == (first.api_key, first.runtime_token)
        headers = _admin_headers(second.base, tmp_path)
        pool = _pool_backends(second.base, headers)
        assert {n: b["created_at"] for n, b in pool.items()} == created
        me = httpx.get(
            f"{second.base}/api/runtime/me",
            headers={"Authorization": f"Bearer {second.runtime_token}"},
        )
        assert me.status_code == 200, me.text


def test_serve_refuses_a_broken_vllm_backends_file(tmp_path):
    from app.lib.vault import generate_key_spec

    env = _env(
        tmp_path,
        ARONA_JWT_SECRET=JWT_SECRET,
        ARONA_VAULT_KEYS=generate_key_spec("k1"),
        ARONA_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'seed.db'}",
    )
    assert _run(["migrate"], env).returncode == 0
    missing = _run(["serve"], {**env, "ARONA_VLLM_BACKENDS_FILE": str(tmp_path / "nope.json")})
    assert missing.returncode != 0
    assert "ARONA_VLLM_BACKENDS_FILE is" in missing.stderr
    assert "does not exist" in missing.stderr
    broken = tmp_path / "vllm-backends.json"
    broken.write_text(
        '{"backends": [{"name": "gpu", "url": "http://10.0.0.1", "type": "comfyui"}]}'
    )
    refused = _run(["serve"], {**env, "ARONA_VLLM_BACKENDS_FILE": str(broken)})
    assert refused.returncode != 0
    assert f"{broken}: backends[0] ('gpu'): type must be \"vllm\"" in refused.stderr


def _migrated_env(tmp_path: Path) -> dict[str, str]:
    from app.lib.vault import generate_key_spec

    env = _env(
        tmp_path,
        ARONA_JWT_SECRET=JWT_SECRET,
        ARONA_VAULT_KEYS=generate_key_spec("k1"),
        ARONA_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'served.db'}",
        ARONA_LOG_LEVEL="INFO",
    )
    migrated = _run(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    return env


def test_serve_on_port_0_logs_the_address_it_serves_on(tmp_path):
    process = subprocess.Popen(
        [ARONA, "serve", "--port", "0"],
        env=_migrated_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            if served := re.search(r"serving\s+url=(http://127\.0\.0\.1:(\d+))$", line.strip()):
                break
        else:
            pytest.fail(f"no address logged:\n{''.join(seen)}")
        assert served.group(2) != "0"
        deadline = time.monotonic() + 30
        while not _healthy(served.group(1)):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"never served:\n{_output_of(process, seen)}")
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)


def test_serve_on_a_taken_port_says_so_before_starting_the_app(tmp_path):
    env = _migrated_env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = _run(["serve", "--port", str(port)], env)
    assert refused.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} for Arona" in refused.stderr
    assert "in use" in refused.stderr
    # At INFO, a started app logs "Started server process"; this one never got there.
    assert "server process" not in refused.stdout + refused.stderr


def test_serve_refuses_missing_or_short_jwt_secret(tmp_path):
    result = _run(["serve"], _env(tmp_path))
    assert result.returncode != 0
    assert "ARONA_JWT_SECRET is missing" in result.stderr
    short = _run(["serve"], _env(tmp_path, ARONA_JWT_SECRET="short"))
    assert "ARONA_JWT_SECRET is too short" in short.stderr


def test_serve_refuses_unmigrated_database_then_migrate_and_create_admin(tmp_path):
    from app.lib.vault import generate_key_spec

    env = _env(
        tmp_path,
        ARONA_JWT_SECRET=JWT_SECRET,
        ARONA_VAULT_KEYS=generate_key_spec("k1"),
        ARONA_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'ops.db'}",
    )
    refused = _run(["serve"], env)
    assert refused.returncode != 0
    assert "Run `arona migrate`" in refused.stderr
    migrated = _run(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    assert "database is at revision" in migrated.stdout
    created = _run(
        ["create-admin", "Ops@Example.com", "--password-stdin"], env, stdin="a-long-password\n"
    )
    assert created.returncode == 0, created.stderr
    assert "created admin ops@example.com" in created.stdout
    again = _run(
        ["create-admin", "ops@example.com", "--password-stdin"], env, stdin="another-password\n"
    )
    assert "promoted admin ops@example.com" in again.stdout
    weak = _run(["create-admin", "x@example.com", "--password-stdin"], env, stdin="short\n")
    assert weak.returncode != 0
    assert "at least 8" in weak.stderr


def test_version_and_module_entry_point(tmp_path):
    version = _run(["version"], _env(tmp_path))
    assert version.returncode == 0
    assert re.match(r"^\d+\.\d+", version.stdout.strip())
    module = subprocess.run(
        [sys.executable, "-m", "app", "version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert module.stdout.strip() == version.stdout.strip()


def test_invalid_setting_is_a_clear_error(tmp_path):
    result = _run(["serve"], _env(tmp_path, ARONA_PORT="eighty"))
    assert result.returncode != 0
    assert "ARONA_PORT must be an integer" in result.stderr
