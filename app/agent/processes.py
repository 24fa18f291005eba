"""Model server processes: start one per model from a command template, wait until it
answers, stop it (SIGTERM, then SIGKILL after a grace period).

The template (``vllm serve {model} --port {port}``) is split with ``shlex`` first and
``{model}`` / ``{port}`` are substituted inside each argument afterwards, so a model
id can never add arguments; nothing runs through a shell. Each server gets a new
process group, so stopping it also stops whatever it spawned.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shlex
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

import aiohttp
import structlog

from app.lib.ports import free_port

READY_POLL_SECONDS = 0.25
OUTPUT_LINES = 20
logger = structlog.get_logger()

Progress = Callable[[int, str], Awaitable[None]]


class DeployError(Exception):
    """The server did not come up; the message says why (sent to the panel)."""


def build_argv(template: str, model: str, port: int) -> list[str]:
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise DeployError(f"the command template does not parse: {exc}") from exc
    if not parts:
        raise DeployError("the command template is empty")
    return [part.replace("{model}", model).replace("{port}", str(port)) for part in parts]


@dataclass(slots=True)
class ModelProcess:
    model: str
    port: int
    process: asyncio.subprocess.Process
    output: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES)
    )
    reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self) -> str:
        return "\n".join(self.output)[-1500:]


@dataclass(slots=True, eq=False)
class ModelProcesses:
    template: str
    _: KW_ONLY
    ready_timeout: float = 600.0
    stop_grace: float = 10.0
    ready_host: str = "127.0.0.1"
    _running: dict[str, ModelProcess] = field(default_factory=dict, init=False)

    def models(self) -> list[str]:
        """Models whose server answered and still runs."""
        return [m for m, p in self._running.items() if p.process.returncode is None]

    def get(self, model: str) -> ModelProcess | None:
        return self._running.get(model)

    async def start(self, model: str, progress: Progress) -> ModelProcess:
        """Start ``model``'s server and wait until ``GET /v1/models`` answers 200.

        Raises ``DeployError`` if the process exits or does not answer within
        ``ready_timeout``; the process is stopped then. A cancelled start stops it too.
        """
        # Below the ephemeral range: the server binds only once its weights are loaded,
        # and the readiness polls below would otherwise risk taking the port first.
        try:
            port = free_port()
        except OSError as exc:
            raise DeployError(f"no free port for the model server: {exc}") from exc
        argv = build_argv(self.template, model, port)
        await progress(5, f"starting {argv[0]}")
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise DeployError(f"could not start {argv[0]}: {exc.strerror or exc}") from exc
        handle = ModelProcess(model=model, port=port, process=process)
        handle.reader = asyncio.create_task(_collect(process, handle.output))
        logger.info("model server started", model=model, port=port, pid=process.pid)
        try:
            await self._wait_ready(handle, progress)
        except BaseException:
            await self._terminate(handle)
            raise
        self._running[model] = handle
        return handle

    async def _wait_ready(self, handle: ModelProcess, progress: Progress) -> None:
        url = f"http://{self.ready_host}:{handle.port}/v1/models"
        started = time.monotonic()
        reported = 10
        await progress(reported, "waiting for the server to answer")
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if handle.process.returncode is not None:
                    await _drain(handle)
                    raise DeployError(
                        f"the server exited with code {handle.process.returncode}"
                        + (f": {handle.tail()}" if handle.output else "")
                    )
                if await _answers(http, url):
                    return
                elapsed = time.monotonic() - started
                if elapsed >= self.ready_timeout:
                    raise DeployError(
                        f"the server did not answer {url} within {self.ready_timeout:g} s"
                    )
                # Progress is the share of the timeout used, capped below done.
                percent = min(90, 10 + int(80 * elapsed / self.ready_timeout))
                if percent > reported:
                    reported = percent
                    await progress(percent, "waiting for the server to answer")
                await asyncio.sleep(READY_POLL_SECONDS)

    async def stop(self, model: str) -> bool:
        """Stop ``model``'s server; False if none was running."""
        handle = self._running.pop(model, None)
        if handle is None:
            return False
        await self._terminate(handle)
        return True

    async def stop_all(self) -> None:
        handles, self._running = list(self._running.values()), {}
        await asyncio.gather(*(self._terminate(h) for h in handles), return_exceptions=True)

    async def _terminate(self, handle: ModelProcess) -> None:
        process = handle.process
        if process.returncode is None:
            _signal_group(process, signal.SIGTERM)
            try:
                async with asyncio.timeout(self.stop_grace):
                    await process.wait()
            except TimeoutError:
                logger.warning("model server ignored SIGTERM; killing", model=handle.model)
                _signal_group(process, signal.SIGKILL)
                await process.wait()
        else:
            # Its children may outlive it in the group.
            _signal_group(process, signal.SIGKILL)
        if handle.reader is not None:
            handle.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handle.reader
        logger.info("model server stopped", model=handle.model, pid=process.pid)


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def _collect(process: asyncio.subprocess.Process, lines: collections.deque[str]) -> None:
    """Keep the last lines of the server's output (quoted when it fails to start)."""
    if process.stdout is None:
        return
    while True:
        line = await process.stdout.readline()
        if not line:
            return
        lines.append(line.decode(errors="replace").rstrip())


async def _drain(handle: ModelProcess) -> None:
    if handle.reader is not None:
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(1.0):
                await asyncio.shield(handle.reader)
