"""Child processes of the harness: started in their own process group, pinned, reaped.

Every server the harness starts (the fake upstream, Arona, LiteLLM) goes through one
``Supervisor``, which kills whole process groups on the way out, so nothing is left
running after an error, Ctrl-C or SIGTERM: LiteLLM in particular may fork workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SUT_CPU = 0
"""The core the system under test runs on."""
LOAD_CPU = 1
"""The core the load generator, the fake upstream and the harness itself run on."""
STOP_GRACE_SECONDS = 5.0
USABLE_CPUS = frozenset(os.sched_getaffinity(0))
"""Read once at import, before the harness pins itself to the load core."""


class BenchError(RuntimeError):
    """A setup step failed; the message says which and why."""


def pinning_available() -> bool:
    return shutil.which("taskset") is not None and {SUT_CPU, LOAD_CPU} <= USABLE_CPUS


def pin_self_to_load_cpu() -> None:
    # The harness parses streams and polls /proc: keep that work off the SUT's core.
    if pinning_available():
        os.sched_setaffinity(0, {LOAD_CPU})


def pinned(argv: Sequence[str], cpu: int | None) -> list[str]:
    if cpu is None or not pinning_available():
        return list(argv)
    return ["taskset", "-c", str(cpu), *argv]


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(slots=True)
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise BenchError(f"{self.name} {how}; last log lines ({self.log}):\n{tail(self.log)}")


@dataclass(slots=True)
class Supervisor:
    children: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cpu: int | None,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            # A new session makes the child a process-group leader: stopping the group
            # also stops whatever it forks (LiteLLM's workers, uvicorn's reloader).
            process = subprocess.Popen(  # noqa: S603 - argv built by the harness
                pinned(argv, cpu),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> None:
        _stop_group(child.process)
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        # Newest first: the SUTs go before the upstream they call.
        while self.children:
            self.stop(self.children[-1])


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    pgid = process.pid  # the child leads its own group (start_new_session)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        try:
            process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; forked children may linger in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return


def run_checked(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> str:
    """Run a short command to completion; its output, or BenchError with the output."""
    try:
        done = subprocess.run(  # noqa: S603 - argv built by the harness
            list(argv),
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise BenchError(
            f"{' '.join(argv[:3])} exited with {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def wait_http(
    url: str, child: Child, *, timeout: float, headers: Mapping[str, str] | None = None
) -> float:
    """Poll ``url`` until it answers 2xx; the seconds it took. Fails early if the child dies."""
    started = time.monotonic()
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            child.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url, headers=dict(headers or {})).is_success:
                    return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise BenchError(
                    f"{child.name} did not answer {url} within {timeout:.0f} s; last log "
                    f"lines ({child.log}):\n{tail(child.log)}"
                )
            time.sleep(0.1)
