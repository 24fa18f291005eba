"""The ``arona`` command as an operator runs it: real processes, real ports."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import JWT_SECRET

ARONA = str(Path(sys.executable).parent / "arona")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[tuple[str, str, str, subprocess.Popen[str]]]:
    port = _free_port()
    env = _env(tmp_path, ARONA_PORT=str(port))
    process = subprocess.Popen(
        [ARONA, "demo", "--upstream-port", str(_free_port())],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    base = f"http://127.0.0.1:{port}"
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            output.append(line)
            if "demo API key" in line:
                break
        text = "".join(output)
        key = re.search(r"demo API key\s+(ak-\S+)", text)
        project = re.search(r"demo project\s+(\S+)", text)
        assert key, text
        assert project, text
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base, key.group(1), project.group(1), process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def test_demo_serves_and_the_printed_key_reaches_an_authenticated_endpoint(demo_server, tmp_path):
    base, key, project_id, _ = demo_server
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


def test_demo_chat_works_out_of_the_box_with_the_openai_sdk(demo_server):
    base, key, _, _ = demo_server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    # The bundled upstream is registered fail-closed and probed at start-up.
    deadline = time.monotonic() + 10
    while not [m for m in client.models.list().data if m.id == "demo-chat"]:
        assert time.monotonic() < deadline, "the demo upstream never turned healthy"
        time.sleep(0.1)
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
