"""The image's health check script against a real ``arona serve``, started the way the
image starts it (the ``arona`` console script, settings from the environment, a working
directory without the repository's config/), and stopped the way Docker stops it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.cli.common import GRACEFUL_SHUTDOWN_SECONDS
from app.lib.ports import free_port
from app.lib.vault import generate_key_spec
from tests.support.infra import HEALTHCHECK_SCRIPT
from tests.support.settings import JWT_SECRET, REDIS_URL

START_DEADLINE_SECONDS = 60.0


async def run_check(port: int, *args: str) -> tuple[int, str]:
    env = {**os.environ, "ARONA_PORT": str(port)}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HEALTHCHECK_SCRIPT),
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def wait_until_listening(port: int, process: asyncio.subprocess.Process, log: Path) -> None:
    async with asyncio.timeout(START_DEADLINE_SECONDS):
        while True:
            if process.returncode is not None:
                output = await asyncio.to_thread(log.read_text)
                pytest.fail(f"arona serve exited with {process.returncode}:\n{output}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            writer.close()
            await writer.wait_closed()
            return


@pytest.fixture
async def served_port(pg_database: str, tmp_path: Path) -> AsyncIterator[int]:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("ARONA_")}
    env |= {
        "ARONA_DATABASE_URL": pg_database,
        "ARONA_REDIS_URL": REDIS_URL,
        "ARONA_REDIS_PREFIX": f"test:{uuid.uuid4().hex}:",
        "ARONA_JWT_SECRET": JWT_SECRET,
        "ARONA_VAULT_KEYS": generate_key_spec("k1"),
        "ARONA_HOST": "127.0.0.1",
        "ARONA_PORT": str(port),
        "ARONA_LOG_LEVEL": "WARNING",
        "ARONA_DB_POOL_SIZE": "2",
    }
    log = tmp_path / "arona.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("arona")),
            "serve",
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        await wait_until_listening(port, process, log)
        yield port
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(GRACEFUL_SHUTDOWN_SECONDS + 30):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
            output = await asyncio.to_thread(log.read_text)
            pytest.fail(f"arona serve did not stop on SIGTERM:\n{output}")
    # `docker stop` and the kubelet send SIGTERM: the server drains, then uvicorn
    # re-raises the signal it captured, so the exit status reports SIGTERM (not a kill).
    log_text = await asyncio.to_thread(log.read_text)
    assert process.returncode == -signal.SIGTERM, log_text
    assert "Traceback" not in log_text, log_text


async def test_healthcheck_passes_on_a_live_and_ready_server(served_port: int) -> None:
    assert await run_check(served_port) == (0, "")
    assert await run_check(served_port, "/healthz") == (0, "")
    assert await run_check(served_port, "/readyz") == (0, "")
    assert await run_check(served_port, "/readyz?allow_degraded=true") == (0, "")


async def test_healthcheck_fails_on_an_error_status(served_port: int) -> None:
    code, message = await run_check(served_port, "/no-such-endpoint")
    assert code == 1
    assert "404" in message


async def test_healthcheck_fails_when_nothing_listens() -> None:
    code, message = await run_check(free_port(), "/healthz")
    assert code == 1
    assert "unhealthy" in message
    assert "refused" in message.lower()


async def test_healthcheck_rejects_a_path_without_a_slash() -> None:
    code, message = await run_check(free_port(), "healthz")
    assert code == 2
    assert "usage" in message
