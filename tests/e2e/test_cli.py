"""The ``arona`` commands as an operator runs them: real processes, real ports."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
from typing import Any

from websockets.asyncio.client import connect

from tests.support.e2e import ARONA, Spawned, cli_env, migrated_env, run_cli, wait_healthy
from tests.support.settings import JWT_SECRET


def test_engine_echo_command_serves_a_cep_handshake(tmp_path):
    echo = Spawned(["engine-echo", "--port", "0", "--token", "t0k"], cli_env(tmp_path), tmp_path)
    try:
        listening = echo.wait_for(r"listening on (ws://127\.0\.0\.1:\d+)")

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
        echo.stop()


def test_agent_command_requires_a_panel_and_a_token(tmp_path):
    result = subprocess.run(
        [ARONA, "agent"], env=cli_env(tmp_path), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "--panel" in result.stderr


def test_serve_refuses_a_broken_vllm_backends_file(tmp_path):
    from app.lib.vault import generate_key_spec

    env = cli_env(
        tmp_path,
        ARONA_JWT_SECRET=JWT_SECRET,
        ARONA_VAULT_KEYS=generate_key_spec("k1"),
        ARONA_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'seed.db'}",
    )
    assert run_cli(["migrate"], env).returncode == 0
    missing = run_cli(["serve"], {**env, "ARONA_VLLM_BACKENDS_FILE": str(tmp_path / "nope.json")})
    assert missing.returncode != 0
    assert "ARONA_VLLM_BACKENDS_FILE is" in missing.stderr
    assert "does not exist" in missing.stderr
    broken = tmp_path / "vllm-backends.json"
    broken.write_text(
        '{"backends": [{"name": "gpu", "url": "http://10.0.0.1", "type": "comfyui"}]}'
    )
    refused = run_cli(["serve"], {**env, "ARONA_VLLM_BACKENDS_FILE": str(broken)})
    assert refused.returncode != 0
    assert f"{broken}: backends[0] ('gpu'): type must be \"vllm\"" in refused.stderr


def test_serve_on_port_0_logs_the_address_it_serves_on(tmp_path):
    served = Spawned(["serve", "--port", "0"], migrated_env(tmp_path), tmp_path)
    try:
        logged = served.wait_for(r"serving\s+url=(http://127\.0\.0\.1:(\d+))\s*$")
        assert logged.group(2) != "0"
        wait_healthy(served, logged.group(1))
    finally:
        status = served.stop(signal.SIGINT)
    # Ctrl-C: drained, then the status of an interrupted command, without "Aborted!".
    assert status == 130, served.everything()
    assert "Aborted" not in served.everything()


def test_serve_on_a_taken_port_says_so_before_starting_the_app(tmp_path):
    env = migrated_env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = run_cli(["serve", "--port", str(port)], env)
    assert refused.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} for Arona" in refused.stderr
    assert "in use" in refused.stderr
    # At INFO, a started app logs "Started server process"; this one never got there.
    assert "server process" not in refused.stdout + refused.stderr


def test_serve_refuses_missing_or_short_jwt_secret(tmp_path):
    result = run_cli(["serve"], cli_env(tmp_path))
    assert result.returncode != 0
    assert "ARONA_JWT_SECRET is missing" in result.stderr
    short = run_cli(["serve"], cli_env(tmp_path, ARONA_JWT_SECRET="short"))
    assert "ARONA_JWT_SECRET is too short" in short.stderr


def test_serve_refuses_unmigrated_database_then_migrate_and_create_admin(tmp_path):
    from app.lib.vault import generate_key_spec

    env = cli_env(
        tmp_path,
        ARONA_JWT_SECRET=JWT_SECRET,
        ARONA_VAULT_KEYS=generate_key_spec("k1"),
        ARONA_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'ops.db'}",
    )
    refused = run_cli(["serve"], env)
    assert refused.returncode != 0
    assert "Run `arona migrate`" in refused.stderr
    migrated = run_cli(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    assert "database is at revision" in migrated.stdout
    created = run_cli(
        ["create-admin", "Ops@Example.com", "--password-stdin"], env, stdin="a-long-password\n"
    )
    assert created.returncode == 0, created.stderr
    assert "created admin ops@example.com" in created.stdout
    again = run_cli(
        ["create-admin", "ops@example.com", "--password-stdin"], env, stdin="another-password\n"
    )
    assert "promoted admin ops@example.com" in again.stdout
    weak = run_cli(["create-admin", "x@example.com", "--password-stdin"], env, stdin="short\n")
    assert weak.returncode != 0
    assert "at least 8" in weak.stderr


def test_version_and_module_entry_point(tmp_path):
    version = run_cli(["version"], cli_env(tmp_path))
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
    result = run_cli(["serve"], cli_env(tmp_path, ARONA_PORT="eighty"))
    assert result.returncode != 0
    assert "ARONA_PORT must be an integer" in result.stderr
