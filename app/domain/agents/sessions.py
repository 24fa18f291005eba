"""One agent's socket session: what each frame it sends does to the stored state.

Garbage policy: a frame that is not a known, well-formed JSON object (binary, bad
JSON, unknown ``type``, wrong fields, over ``MAX_FRAME_BYTES``) is answered with an
``error`` frame (code ``malformed_frame``) and otherwise ignored. After
``MAX_BAD_FRAMES`` such frames in a row (a valid frame resets the count) the socket
is closed with 1008: a broken agent stops costing the panel work, and reconnects
once fixed. A well-formed frame the panel cannot use (a result for a model it is
not deploying, anything before ``register``) gets an ``error`` frame with its own
code and does not count as garbage.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import msgspec
import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.agents import events
from app.domain.agents.backends import AgentBackends, backend_name
from app.domain.agents.hub import AgentHub, AgentLink
from app.domain.agents.services import AgentDeploymentService, AgentNodeService
from app.lib.agent_frames import (
    MAX_FRAME_BYTES,
    AgentFrame,
    DeployProgress,
    DeployResult,
    Error,
    Heartbeat,
    Register,
    Registered,
    StopResult,
    agent_frame_decoder,
)
from app.lib.events.base import EventBus
from app.lib.input_checks import unstorable_path

MAX_BAD_FRAMES = 5
logger = structlog.get_logger()


class CloseSession(Exception):
    """The session must end; ``reason`` goes into the close frame."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class SessionDeps:
    db_config: SQLAlchemyAsyncConfig
    hub: AgentHub
    backends: AgentBackends
    bus: EventBus


class AgentSession:
    def __init__(
        self, deps: SessionDeps, *, agent_id: UUID, name: str, link: AgentLink, peer: str
    ) -> None:
        self._deps = deps
        self.agent_id = agent_id
        self.name = name
        self._link = link
        self._peer = peer
        self._bad = 0
        self.registered = False
        self.replies: list[msgspec.Struct] = []
        """Frames to send back for the frame just handled (read and cleared by the socket)."""

    # ----------------------------------------------------------------- decoding

    def decode(self, data: str | bytes | None) -> AgentFrame | None:
        if isinstance(data, bytes) or data is None:
            self._garbage("frames must be JSON text, not binary")
            return None
        if len(data) > MAX_FRAME_BYTES:
            self._garbage(f"frame larger than {MAX_FRAME_BYTES} bytes")
            return None
        try:
            frame = agent_frame_decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._garbage(str(exc)[:300])
            return None
        except RecursionError:
            self._garbage("frame nested too deeply")
            return None
        if "\\u0000" in data:
            # Frames name models and deployments that are stored: no NUL in them.
            where = unstorable_path(msgspec.to_builtins(frame))
            if where is not None:
                self._garbage(f"`{where}` contains a NUL character, which cannot be stored")
                return None
        self._bad = 0
        return frame

    def _garbage(self, message: str) -> None:
        self._bad += 1
        if self._bad >= MAX_BAD_FRAMES:
            raise CloseSession(f"{MAX_BAD_FRAMES} malformed frames in a row")
        self._error("malformed_frame", message)
        return None

    def _error(self, code: str, message: str) -> None:
        self.replies.append(Error(code=code, message=message))

    # ----------------------------------------------------------------- frames

    async def handle(self, frame: AgentFrame) -> None:
        if isinstance(frame, Register):
            await self._register(frame)
        elif not self.registered:
            self._error("not_registered", "send a register frame first")
        elif isinstance(frame, Heartbeat):
            await self._heartbeat(frame)
        elif isinstance(frame, DeployProgress):
            await self._progress(frame)
        elif isinstance(frame, DeployResult):
            await self._deploy_result(frame)
        else:
            await self._stop_result(frame)

    async def _register(self, frame: Register) -> None:
        host = frame.host.strip() or self._peer
        async with AgentNodeService.new(config=self._deps.db_config) as agents:
            found = await agents.mark_registered(
                self.agent_id, frame, host, self._link.connection_id
            )
        if not found:
            raise CloseSession("agent identity deleted")
        first = not self.registered
        self.registered = True
        if first:
            await self._deps.hub.attach(self.agent_id, self._link)
        self.replies.append(Registered(agent_id=str(self.agent_id), name=self.name))
        await events.agent_changed(self._deps.bus, self.agent_id)
        logger.info("agent registered", agent=self.name, host=host, gpus=len(frame.gpus))

    async def _heartbeat(self, frame: Heartbeat) -> None:
        async with AgentNodeService.new(config=self._deps.db_config) as agents:
            if not await agents.record_heartbeat(self.agent_id, frame, self._link.connection_id):
                raise CloseSession("agent identity deleted or connected elsewhere")
        async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
            served = set(frame.models)
            running = await deployments.running_of_agent(self.agent_id)
            gone = [row for row in running if row.model_id not in served]
            for row in gone:
                await deployments.save(
                    row, status="stopped", error="the agent no longer serves this model"
                )
        for row in gone:
            await self._deps.backends.sync(row.model_id)
            await events.deployment_changed(self._deps.bus, row)
        await events.agent_changed(self._deps.bus, self.agent_id)

    async def _progress(self, frame: DeployProgress) -> None:
        async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
            row = await deployments.current(self.agent_id, frame.model_id, ("deploying",))
            if row is None:
                return self._unknown(frame.model_id)
            row = await deployments.save(row, progress=frame.progress, message=frame.message)
        await events.deployment_changed(self._deps.bus, row)

    async def _deploy_result(self, frame: DeployResult) -> None:
        async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
            row = await deployments.current(self.agent_id, frame.model_id, ("deploying",))
            if row is None:
                return self._unknown(frame.model_id)
            if frame.ok and frame.port is not None:
                # The backend's name goes in with "running" (one write): a reader never
                # sees a running deployment without it. The backend follows at once.
                row = await deployments.save(
                    row,
                    status="running",
                    port=frame.port,
                    progress=100,
                    message="running",
                    backend_name=backend_name(frame.model_id),
                )
            else:
                error = frame.error or (
                    "the agent reported success without a port" if frame.ok else "deploy failed"
                )
                row = await deployments.save(row, status="failed", error=error, message="failed")
        if row.status == "running":
            await self._record_backend(row.id, frame.model_id)
        else:
            await events.deployment_changed(self._deps.bus, row)

    async def _record_backend(self, deployment_id: UUID, model_id: str) -> None:
        try:
            await self._deps.backends.sync(model_id)
        except Exception as exc:
            logger.warning("could not register an agent backend", model=model_id, error=repr(exc))
            async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
                row = await deployments.save(
                    await deployments.require(deployment_id),
                    status="failed",
                    backend_name=None,
                    error=f"could not register the backend: {exc}",
                )
        else:
            async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
                row = await deployments.require(deployment_id)
        await events.deployment_changed(self._deps.bus, row)

    async def _stop_result(self, frame: StopResult) -> None:
        async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
            row = await deployments.current(self.agent_id, frame.model_id, ("stopping",))
            if row is None:
                return self._unknown(frame.model_id)
        if frame.ok:
            # The backend goes first (a stopping deployment no longer serves): whoever
            # reads "stopped" must not still find the backend routed to.
            await self._deps.backends.sync(frame.model_id)
            async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
                row = await deployments.save(
                    await deployments.require(row.id), status="stopped", message="stopped"
                )
        else:
            error = f"stop failed: {frame.error or 'no reason given'}"
            status = "running" if row.port is not None else "failed"
            async with AgentDeploymentService.new(config=self._deps.db_config) as deployments:
                row = await deployments.save(
                    await deployments.require(row.id), status=status, error=error, message=status
                )
            await self._deps.backends.sync(frame.model_id)
        await events.deployment_changed(self._deps.bus, row)

    def _unknown(self, model_id: str) -> None:
        self._error("unknown_deployment", f"no matching deployment of {model_id} on this agent")

    async def end(self) -> None:
        """The socket closed: forget it here and mark the agent offline (if still ours)."""
        self._deps.hub.detach(self.agent_id, self._link)
        if not self.registered:
            return
        async with AgentNodeService.new(config=self._deps.db_config) as agents:
            await agents.mark_disconnected(self.agent_id, self._link.connection_id)
        await events.agent_changed(self._deps.bus, self.agent_id)
