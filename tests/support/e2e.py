"""Running the ``arona`` command as an operator does: real processes, real ports."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import httpx
import pytest

from tests.support.settings import JWT_SECRET

ARONA = str(Path(sys.executable).parent / "arona")
START_SECONDS = 60.0
STOP_SECONDS = 20.0


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARONA_")}
    env["ARONA_DATA_DIR"] = str(tmp_path / "data")
    env["ARONA_LOG_LEVEL"] = "WARNING"
    env.update(extra)
    return env


def run_cli(
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


def migrated_env(tmp_path: Path) -> dict[str, str]:
    """Settings for ``arona serve`` on a fresh, migrated SQLite file (logs at INFO)."""
    from app.lib.vault import generate_key_spec

    env = cli_env(
        tmp_path,
        ARONA_JWT_SECRET=JWT_SECRET,
        ARONA_VAULT_KEYS=generate_key_spec("k1"),
        ARONA_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'served.db'}",
        ARONA_LOG_LEVEL="INFO",
    )
    migrated = run_cli(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    return env


class Spawned:
    """A running ``arona`` process whose output a thread drains (a full pipe would stop
    the process) and the test reads with deadlines (a silent process must fail the
    test, not hang it)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [ARONA, *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._ended = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._drain, args=(self.process.stdout,), daemon=True).start()

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _next_line(self, timeout: float) -> str | None:
        """The next line, kept in ``lines``; None once the output has ended. Raises
        ``queue.Empty`` if none comes within ``timeout``."""
        if self._ended:
            return None
        line = self._queue.get(timeout=timeout)
        if line is None:
            self._ended = True
        else:
            self.lines.append(line)
        return line

    def wait_for(self, pattern: str, within: float = START_SECONDS) -> re.Match[str]:
        """The first match of ``pattern`` in a line yet to be read; fails the test with
        everything the process printed if none comes within ``within`` seconds."""
        deadline = time.monotonic() + within
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._next_line(remaining)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"exited ({self.process.wait()}) before {pattern!r}:\n{self.text}")
            if match := re.search(pattern, line):
                return match
        pytest.fail(f"no {pattern!r} within {within}s:\n{self.everything()}")

    def everything(self) -> str:
        """All it printed, once it is stopped (killed if still running)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=STOP_SECONDS)
        with contextlib.suppress(queue.Empty):
            while self._next_line(STOP_SECONDS) is not None:
                pass
        return self.text

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=STOP_SECONDS)


def healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(spawned: Spawned, base: str, within: float = START_SECONDS) -> None:
    deadline = time.monotonic() + within
    while not healthy(base):
        if spawned.process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{base} never turned healthy:\n{spawned.everything()}")
        time.sleep(0.1)


# -- arona demo -----------------------------------------------------------------------

FREE_PORTS = ["--port", "0", "--upstream-port", "0", "--pool-port", "0", "--engine-port", "0"]
POOL = {"vllm-a": ["general"], "vllm-b": ["general", "smart"], "vllm-c": ["general", "smart"]}


class Demo(NamedTuple):
    base: str
    api_key: str
    project_id: str
    runtime_token: str
    output: str
    """The banner."""
    spawned: Spawned


@contextlib.contextmanager
def running_demo(tmp_path: Path) -> Iterator[Demo]:
    """``arona demo`` with every port picked free by the demo itself (a port chosen here
    could be taken by another socket before the demo binds it), until the block exits."""
    spawned = Spawned(["demo", *FREE_PORTS], cli_env(tmp_path), tmp_path)
    try:
        spawned.wait_for(r"/api/runtime/me")  # the banner's last line
        banner = spawned.text
        found = [
            re.search(pattern, banner)
            for pattern in (
                r"health\s+(http://127\.0\.0\.1:\d+)/healthz",
                r"demo API key\s+(ak-\S+)",
                r"demo project\s+(\S+)",
                r"runtime token\s+(\S+)",
            )
        ]
        if not all(found):
            pytest.fail(f"an incomplete banner:\n{spawned.everything()}")
        base, key, project, runtime = (match.group(1) for match in found if match)
        wait_healthy(spawned, base)
        yield Demo(base, key, project, runtime, banner, spawned)
    finally:
        spawned.stop()


def admin_headers(base: str, tmp_path: Path) -> dict[str, str]:
    stored = json.loads((tmp_path / "data" / "demo.json").read_text())
    response = httpx.post(
        f"{base}/api/auth/login",
        json={"email": "admin@demo.arona.local", "password": stored["admin_password"]},
    )
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['accessToken']}"}


def pool_backends(base: str, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{base}/api/admin/backends?limit=500", headers=headers)
    assert response.status_code == 200, response.text
    return {i["name"]: i for i in response.json()["items"] if i["name"] in POOL}
