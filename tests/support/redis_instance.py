"""A Redis server of the test's own, on a free loopback port, that the test can stop and
start again on the same port (the shared Redis on 6379 is never touched)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from app.lib.ports import free_port

START_TIMEOUT_SECONDS = 10.0


class RedisInstance:
    def __init__(self, workdir: Path, *, extra_args: Sequence[str] = ()) -> None:
        """``extra_args``: more ``redis-server`` options (a password, a Unix socket,
        a TLS port); the plain port is always there, for the readiness check."""
        binary = shutil.which("redis-server")
        if binary is None:  # .ci/run installs it; a missing server is a failure, not a skip
            raise RuntimeError("redis-server is not installed")
        self._binary = binary
        self._workdir = workdir
        self.port = free_port()
        self._extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        log = (self._workdir / "redis.log").open("ab")
        self._process = subprocess.Popen(
            [
                self._binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
                *self._extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server not ready on {self.port}: {self.log()}")

    def kill(self) -> None:
        """Stop at once, as a crash or a lost host would (SIGKILL: nothing is saved)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)

    def log(self) -> str:
        path = self._workdir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""
