"""This replica's agent sockets, and panel -> agent commands across replicas.

An agent's socket lands on one replica; an admin request may land on another. A
command for an agent held here is sent at once. Otherwise it is published on
``agents.commands``; the replica holding the socket sends it and answers with an
``ack`` on the same channel. A command nobody acknowledges within
``command_timeout`` seconds was not delivered (``send`` returns False), so a caller
never hangs on an agent that no replica holds.

Event shapes on ``agents.commands`` (the bus adds ``channel``)::

    {"kind": "command", "id", "agent_id", "frame": {...}, "origin"}
    {"kind": "ack", "id", "origin"}            (origin: the replica that asked)
    {"kind": "disconnect", "agent_id", "reason", "origin"}
    {"kind": "attached", "agent_id", "connection_id", "origin"}

``attached`` keeps one socket per agent in the whole cluster: an agent that
reconnected through another replica has its older socket closed, so a command is
never delivered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol
from uuid import UUID, uuid4

import msgspec
import structlog

from app.lib.agent_frames import Command, command_decoder
from app.lib.events.base import Event, EventBus

COMMANDS_CHANNEL = "agents.commands"
DEFAULT_COMMAND_TIMEOUT = 5.0
SHUTDOWN_WAIT_SECONDS = 3.0
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
logger = structlog.get_logger()


class AgentLink(Protocol):
    """One open agent socket, as the hub drives it."""

    connection_id: str

    async def send_command(self, frame: Command) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...

    async def wait_ended(self) -> None:
        """Until the socket's session has recorded its end."""
        ...


class AgentHub:
    def __init__(self, bus: EventBus, *, command_timeout: float = DEFAULT_COMMAND_TIMEOUT) -> None:
        self._bus = bus
        self._links: dict[UUID, AgentLink] = {}
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self.command_timeout = command_timeout
        """Seconds a command may wait for the replica holding the agent's socket."""
        self.origin = uuid4().hex

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._links

    def __len__(self) -> int:
        return len(self._links)

    # ------------------------------------------------------------- local sockets

    async def attach(self, agent_id: UUID, link: AgentLink) -> None:
        """Hold ``link`` as the agent's socket; an older one (here or elsewhere) closes."""
        old = self._links.get(agent_id)
        self._links[agent_id] = link
        if old is not None and old is not link:
            await _close(old, CLOSE_POLICY, "replaced by a newer connection of this agent")
        await self._publish(
            {"kind": "attached", "agent_id": str(agent_id), "connection_id": link.connection_id}
        )

    def detach(self, agent_id: UUID, link: AgentLink) -> None:
        if self._links.get(agent_id) is link:
            del self._links[agent_id]

    async def disconnect(self, agent_id: UUID, reason: str) -> None:
        """Close the agent's socket on whichever replica holds it."""
        await self._close_local(agent_id, reason)
        await self._publish({"kind": "disconnect", "agent_id": str(agent_id), "reason": reason})

    async def _close_local(self, agent_id: UUID, reason: str) -> None:
        link = self._links.pop(agent_id, None)
        if link is not None:
            await _close(link, CLOSE_POLICY, reason)

    async def close(self) -> None:
        """Close every socket held here (shutdown); the agents reconnect elsewhere."""
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(
            *(_close(link, CLOSE_GOING_AWAY, "panel shutting down") for link in links)
        )
        # Each session marks its agent offline as it ends: let that reach the database.
        if links:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHUTDOWN_WAIT_SECONDS):
                    await asyncio.gather(*(link.wait_ended() for link in links))
        for future in self._pending.values():
            if not future.done():
                future.set_result(False)

    # ------------------------------------------------------------------ commands

    async def send(self, agent_id: UUID, frame: Command) -> bool:
        """Deliver ``frame`` to the agent's socket on any replica; False if nobody did."""
        link = self._links.get(agent_id)
        if link is not None:
            return await _deliver(link, frame)
        command_id = uuid4().hex
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        try:
            await self._publish(
                {
                    "kind": "command",
                    "id": command_id,
                    "agent_id": str(agent_id),
                    "frame": msgspec.to_builtins(frame),
                }
            )
            try:
                return await asyncio.wait_for(future, self.command_timeout)
            except TimeoutError:
                return False
        finally:
            self._pending.pop(command_id, None)

    async def apply(self, event: Event) -> None:
        kind = event.get("kind")
        if kind == "ack":
            future = self._pending.get(str(event.get("id")))
            if event.get("origin") == self.origin and future is not None and not future.done():
                future.set_result(True)
            return
        if event.get("origin") == self.origin:
            return
        agent_id = _uuid(event.get("agent_id"))
        if agent_id is None:
            return
        if kind == "command":
            await self._command(agent_id, event)
        elif kind == "disconnect":
            await self._close_local(agent_id, str(event.get("reason") or "disconnected"))
        elif kind == "attached":
            link = self._links.get(agent_id)
            if link is not None and link.connection_id != event.get("connection_id"):
                await self._close_local(agent_id, "the agent reconnected through another replica")

    async def _command(self, agent_id: UUID, event: Event) -> None:
        link = self._links.get(agent_id)
        if link is None:
            return  # another replica holds it, or nobody: the requester times out
        try:
            frame = command_decoder.decode(msgspec.json.encode(event.get("frame")))
        except (msgspec.ValidationError, msgspec.DecodeError):
            logger.warning("ignoring a malformed agent command", agent=str(agent_id))
            return
        if await _deliver(link, frame):
            # The ack carries the requester's origin, so only it resolves its future.
            await self._bus.publish(
                COMMANDS_CHANNEL,
                {"kind": "ack", "id": event.get("id"), "origin": event.get("origin")},
            )

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow ``agents.commands`` until cancelled."""
        async with self._bus.subscribe(COMMANDS_CHANNEL) as events:
            if ready is not None:
                ready.set()
            async for event in events:
                try:
                    await self.apply(event)
                except Exception as exc:
                    logger.warning("could not apply an agent command event", error=repr(exc))

    async def _publish(self, event: dict[str, Any]) -> None:
        await self._bus.publish(COMMANDS_CHANNEL, {**event, "origin": self.origin})


def _uuid(value: object) -> UUID | None:
    try:
        return UUID(str(value))
    except ValueError:
        return None


async def _deliver(link: AgentLink, frame: Command) -> bool:
    try:
        await link.send_command(frame)
    except Exception as exc:  # the socket closed under us
        logger.info("could not send a command to an agent", error=repr(exc))
        return False
    return True


async def _close(link: AgentLink, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):
        await link.close(code, reason)
