"""``arona demo``, the newcomer's first run, as a real process on ports it picks."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.e2e import (
    POOL,
    Demo,
    admin_headers,
    cli_env,
    pool_backends,
    run_cli,
    running_demo,
)


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[Demo]:
    with running_demo(tmp_path) as demo:
        yield demo


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


def _reply(client: openai.OpenAI, model: str, content: str, *, stream: bool = False) -> str:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": content}]
    if stream:
        chunks = client.chat.completions.create(model=model, messages=messages, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model=model, messages=messages)
    return reply.choices[0].message.content or ""


def test_demo_chat_works_out_of_the_box_with_the_openai_sdk(demo_server):
    base, key, project_id, *_ = demo_server
    # The bundled upstream is registered fail-closed and probed at start-up.
    client = _client_once_listed(base, key, "demo-chat")
    assert "demo-upstream" in _reply(client, "demo-chat", "Hello")
    assert "demo-upstream" in _reply(client, "demo-chat", "Hello", stream=True)
    embedded = client.embeddings.create(model="demo-embed", input="hello")
    assert embedded.data[0].embedding
    # The demo's price book prices them at once (records reach the database in batches).
    url = f"{base}/api/projects/{project_id}/usage"
    deadline = time.monotonic() + 10
    while True:
        items = httpx.get(url, headers={"Authorization": f"Bearer {key}"}).json()["items"]
        if len(items) >= 3:
            break
        assert time.monotonic() < deadline, items
        time.sleep(0.2)
    assert {item["modelRequested"] for item in items} == {"demo-chat", "demo-embed"}
    for item in items:
        assert item["currency"] == "USD", item
        assert item["costMicros"] is not None, item
        assert item["cost"] == item["costMicros"] / 1_000_000


def test_demo_registers_the_reference_engine_and_chats_through_it(demo_server):
    base, key, *_ = demo_server
    assert re.search(
        r"CEP engine\s+ws://127\.0\.0\.1:\d+\s+\(backend demo-engine", demo_server.output
    )
    client = _client_once_listed(base, key, "demo-echo")
    assert "ping over CEP" in _reply(client, "demo-echo", "ping over CEP")
    assert "streamed" in _reply(client, "demo-echo", "streamed", stream=True)
    assert client.embeddings.create(model="demo-echo-embed", input="hi").data[0].embedding


def test_demo_stops_on_ctrl_c_with_a_goodbye_and_status_0(tmp_path):
    with running_demo(tmp_path) as demo:
        assert httpx.get(f"{demo.base}/healthz", timeout=5).status_code == 200
        status = demo.spawned.stop(signal.SIGINT)
        rest = demo.spawned.everything()
    assert status == 0, rest
    assert "Arona demo stopped" in rest, rest
    assert "Aborted" not in rest
    assert "Traceback" not in rest


def test_demo_on_a_taken_port_says_so_before_touching_its_data(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = run_cli(["demo", "--port", "0", "--engine-port", str(port)], cli_env(tmp_path))
    assert refused.returncode == 1, refused.stdout
    assert f"cannot listen on 127.0.0.1:{port} for the CEP engine" in refused.stderr
    assert "in use" in refused.stderr
    assert not (tmp_path / "data").exists()
    out_of_range = run_cli(["demo", "--port", "70000"], cli_env(tmp_path))
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
    headers = admin_headers(base, tmp_path)
    # Seeded through the operator's path: a vLLM backends file in the data dir.
    seeded = json.loads((tmp_path / "data" / "vllm-backends.json").read_text())
    urls = {entry["name"]: entry["url"] for entry in seeded["backends"]}
    assert set(urls) == set(POOL)
    for name, url in urls.items():
        assert f"{name:<8} {url}  tags {', '.join(POOL[name])}" in demo_server.output

    deadline = time.monotonic() + 15
    while True:
        pool = pool_backends(base, headers)
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
    with running_demo(tmp_path) as first:
        headers = admin_headers(first.base, tmp_path)
        created = {n: b["created_at"] for n, b in pool_backends(first.base, headers).items()}
    with running_demo(tmp_path) as second:
        assert (second.api_key, second.runtime_token) == (first.api_key, first.runtime_token)
        headers = admin_headers(second.base, tmp_path)
        pool = pool_backends(second.base, headers)
        assert {n: b["created_at"] for n, b in pool.items()} == created
        me = httpx.get(
            f"{second.base}/api/runtime/me",
            headers={"Authorization": f"Bearer {second.runtime_token}"},
        )
        assert me.status_code == 200, me.text
        # Its bundled servers got new free ports this time: each is found where it is now.
        for name, shown in pool.items():
            assert f"{name:<8} {shown['url']}  tags" in second.output
        client = _client_once_listed(second.base, second.api_key, "demo-chat")
        assert "demo-upstream" in _reply(client, "demo-chat", "again")
        echoed = _client_once_listed(second.base, second.api_key, "demo-echo")
        assert "still here" in _reply(echoed, "demo-echo", "still here")
