"""The agent's connection to the panel: register, heartbeat, run deploy/stop commands.

It reconnects with exponential backoff (1 s doubling to ``MAX_BACKOFF_SECONDS``, with
jitter) whenever the panel goes away; model servers keep running meanwhile. Frames
that could not be sent while disconnected (a deploy result, say) are kept, up to
``OUTBOX_SIZE``, and sent after the next ``register``. A token the panel refuses
(HTTP 401) ends the agent: retrying cannot fix it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import msgspec
import structlog
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.agent.processes import DeployError, ModelProcesses
from app.lib.agent_frames import (
    Deploy,
    DeployProgress,
    DeployResult,
    Error,
    Gpu,
    Heartbeat,
    Register,
    Registered,
    Stop,
    StopResult,
    encode,
    panel_frame_decoder,
)

MAX_BACKOFF_SECONDS = 30.0
OUTBOX_SIZE = 100
logger = structlog.get_logger()


class TokenRefusedError(Exception):
    """The panel refused the token (401): the identity is unknown or was deleted."""


def socket_url(panel: str) -> str:
    """``http(s)://host[:port][/prefix]`` or a ``ws(s)://`` URL -> the agent socket URL."""
    parts = urlsplit(panel.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.netloc:
        raise ValueError(f"--panel must be an http(s):// or ws(s):// URL, got {panel!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/ws/agent"):
        path += "/ws/agent"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True, slots=True)
class AgentOptions:
    panel: str
    token: str
    machine_name: str
    version: str
    advertise_host: str | None = None
    heartbeat_seconds: float = 10.0


class AgentClient:
    def __init__(
        self,
        options: AgentOptions,
        processes: ModelProcesses,
        *,
        gpus: Callable[[], Awaitable[list[Gpu]]],
    ) -> None:
        self._options = options
        self._url = socket_url(options.panel)
        self._processes = processes
        self._gpus = gpus
        self._ws: ClientConnection | None = None
        self._outbox: collections.deque[str] = collections.deque(maxlen=OUTBOX_SIZE)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """The deploy or stop in progress per model (a new command replaces it)."""
        self.registered = asyncio.Event()

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Stay connected until cancelled; raises ``TokenRefusedError`` on a 401."""
        delay = 1.0
        while True:
            try:
                await self._session()
                delay = 1.0  # it was up: start the backoff over
            except InvalidStatus as exc:
                if exc.response.status_code == 401:
                    raise TokenRefusedError(_body(exc)) from exc
                logger.warning("panel refused the connection", status=exc.response.status_code)
            except (OSError, ConnectionClosed, TimeoutError) as exc:
                logger.warning("panel connection lost", error=repr(exc))
            self.registered.clear()
            wait = delay * (0.5 + random.random() / 2)  # noqa: S311 (jitter, not crypto)
            logger.info("reconnecting", seconds=round(wait, 2))
            await asyncio.sleep(wait)
            delay = min(MAX_BACKOFF_SECONDS, delay * 2)

    async def _session(self) -> None:
        headers = {"Authorization": f"Bearer {self._options.token}"}
        async with connect(self._url, additional_headers=headers, open_timeout=10) as ws:
            self._ws = ws
            try:
                host = self._options.advertise_host or str(ws.local_address[0])
                await ws.send(
                    encode(
                        Register(
                            machine_name=self._options.machine_name,
                            version=self._options.version,
                            host=host,
                            gpus=await self._gpus(),
                        )
                    )
                )
                heartbeat = asyncio.create_task(self._heartbeats(ws))
                try:
                    async for message in ws:
                        await self._on_message(message)
                finally:
                    heartbeat.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await heartbeat
            finally:
                self._ws = None
        if ws.close_code is not None and ws.close_code != 1000:
            logger.warning("panel closed the socket", code=ws.close_code, reason=ws.close_reason)

    async def _heartbeats(self, ws: ClientConnection) -> None:
        await self.registered.wait()
        while True:
            frame = Heartbeat(gpus=await self._gpus(), models=self._processes.models())
            await ws.send(encode(frame))
            await asyncio.sleep(self._options.heartbeat_seconds)

    async def _send(self, frame: msgspec.Struct) -> None:
        text = encode(frame)
        ws = self._ws
        if ws is not None and self.registered.is_set():
            try:
                await ws.send(text)
                return
            except ConnectionClosed:
                pass
        self._outbox.append(text)

    # -------------------------------------------------------------- commands

    async def _on_message(self, message: str | bytes) -> None:
        try:
            frame = panel_frame_decoder.decode(message)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            logger.warning("ignoring a frame the agent does not understand", error=str(exc))
            return
        if isinstance(frame, Registered):
            logger.info("registered with the panel", agent=frame.name, agent_id=frame.agent_id)
            self.registered.set()
            while self._outbox and self._ws is not None:
                await self._ws.send(self._outbox.popleft())
        elif isinstance(frame, Error):
            logger.warning("the panel refused a frame", code=frame.code, message=frame.message)
        elif isinstance(frame, Deploy):
            self._replace(frame.model_id, self._deploy(frame.model_id))
        elif isinstance(frame, Stop):
            self._replace(frame.model_id, self._stop(frame.model_id))

    def _replace(self, model: str, work: Awaitable[None]) -> None:
        previous = self._tasks.get(model)
        task = asyncio.create_task(self._after(previous, work), name=f"agent-{model}")
        self._tasks[model] = task
        task.add_done_callback(lambda t: self._forget(model, t))

    def _forget(self, model: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(model) is task:
            del self._tasks[model]

    async def _after(self, previous: asyncio.Task[None] | None, work: Awaitable[None]) -> None:
        """A new command for a model cancels a deploy still starting, then runs."""
        if previous is not None and not previous.done():
            previous.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        await work

    async def _deploy(self, model: str) -> None:
        # A redeploy replaces the running server.
        await self._processes.stop(model)

        async def progress(percent: int, message: str) -> None:
            await self._send(DeployProgress(model_id=model, progress=percent, message=message))

        try:
            handle = await self._processes.start(model, progress)
        except DeployError as exc:
            logger.warning("deploy failed", model=model, error=str(exc))
            await self._send(DeployResult(model_id=model, ok=False, error=str(exc)[:4000]))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("deploy crashed", model=model)
            await self._send(DeployResult(model_id=model, ok=False, error=repr(exc)[:4000]))
            return
        await self._send(DeployResult(model_id=model, ok=True, port=handle.port))

    async def _stop(self, model: str) -> None:
        try:
            await self._processes.stop(model)
        except Exception as exc:
            await self._send(StopResult(model_id=model, ok=False, error=repr(exc)[:4000]))
            return
        await self._send(StopResult(model_id=model, ok=True))

    async def close(self) -> None:
        """Cancel work in progress and stop every model server (on exit)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._processes.stop_all()


def _body(exc: InvalidStatus) -> str:
    body = exc.response.body or b""
    return body.decode(errors="replace")[:500] or "the panel refused the agent token"
