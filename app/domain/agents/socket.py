"""``/ws/agent``: the authenticated socket GPU agents keep open to the panel.

The agent presents ``Authorization: Bearer <token>`` on the handshake. A missing,
unknown or deleted token is refused *before* the socket is accepted: with an HTTP
401 and the API's JSON error body where the server supports WebSocket denial
responses (uvicorn does), else a close with code 1008 and the reason. Unknown
tokens are remembered briefly (``app.domain.agents.tokens``), so a flood of bad handshakes
costs no database query each.

After ``accept`` the agent must send ``register`` within ``REGISTER_SECONDS``; then
frames flow as described in ``app.lib.agent_frames`` and handled in
``app.domain.agents.sessions``. Close codes: 1001 panel shutting down, 1008 policy
(identity deleted, replaced by a newer connection, too many malformed frames, no
register in time).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from uuid import uuid4

import msgspec
import structlog
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

from app.domain.agents.hub import CLOSE_POLICY
from app.domain.agents.sessions import AgentSession, CloseSession
from app.domain.agents.setup import Agents
from app.domain.asgi_io import refuse_websocket
from app.lib.agent_frames import Command, encode
from app.lib.errors import error_body

REGISTER_SECONDS = 30.0
logger = structlog.get_logger()


class SocketLink:
    """The hub's handle on one accepted socket; sends are serialised."""

    def __init__(self, socket: WebSocket[Any, Any, Any]) -> None:
        self._socket = socket
        self._lock = asyncio.Lock()
        self.connection_id = uuid4().hex
        self.closed = False
        self.ended = asyncio.Event()

    async def wait_ended(self) -> None:
        await self.ended.wait()

    async def send_frame(self, frame: msgspec.Struct) -> None:
        async with self._lock:
            await self._socket.send_text(encode(frame))

    async def send_command(self, frame: Command) -> None:
        await self.send_frame(frame)

    async def close(self, code: int, reason: str) -> None:
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            await self._socket.close(code=code, reason=reason[:120])


def _bearer(socket: WebSocket[Any, Any, Any]) -> str | None:
    header = socket.headers.get("authorization") or ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def _deny(socket: WebSocket[Any, Any, Any], code: str, message: str) -> None:
    """Refuse the handshake: HTTP 401 with the error body, or a 1008 close."""
    body = msgspec.json.encode(error_body(401, message, code))
    await refuse_websocket(
        socket, 401, body, reason=message, headers=[(b"www-authenticate", b"Bearer")]
    )


async def _next_text(socket: WebSocket[Any, Any, Any], wait: float | None) -> str | bytes | None:
    """The next frame's payload; raises ``WebSocketDisconnect`` when the peer left."""
    async with asyncio.timeout(wait):
        message = await socket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(detail="disconnected")
    text = message.get("text")
    if isinstance(text, str):
        return text
    data = message.get("bytes")
    return data if isinstance(data, bytes) else None


@websocket("/ws/agent", name="agent_socket")
async def agent_socket(socket: WebSocket[Any, Any, Any], agents: Agents) -> None:
    token = _bearer(socket)
    if token is None:
        await _deny(socket, "missing_token", "send the agent token as `Authorization: Bearer`")
        return
    identity = await agents.tokens.identify(token)
    if identity is None:
        await _deny(socket, "invalid_token", "unknown or deleted agent token")
        return
    agent_id, name = identity
    await socket.accept()
    link = SocketLink(socket)
    client = socket.client
    session = AgentSession(
        agents.session_deps,
        agent_id=agent_id,
        name=name,
        link=link,
        peer=client.host if client is not None else "",
    )
    await _serve(socket, link, session)


async def _serve(socket: WebSocket[Any, Any, Any], link: SocketLink, session: AgentSession) -> None:
    try:
        while not link.closed:
            wait = None if session.registered else REGISTER_SECONDS
            try:
                data = await _next_text(socket, wait)
            except TimeoutError:
                raise CloseSession(f"no register frame within {REGISTER_SECONDS:g} s") from None
            frame = session.decode(data)
            if frame is not None:
                await session.handle(frame)
            replies, session.replies = session.replies, []
            for reply in replies:
                await link.send_frame(reply)
    except CloseSession as exc:
        logger.info("closing an agent socket", agent=session.name, reason=exc.reason)
        with contextlib.suppress(Exception):
            for reply in session.replies:
                await link.send_frame(reply)
            await link.close(CLOSE_POLICY, exc.reason)
    except WebSocketDisconnect:
        pass
    except Exception as exc:
        # A database outage, say: the agent reconnects with backoff and tries again.
        logger.warning("agent socket failed", agent=session.name, error=repr(exc))
        with contextlib.suppress(Exception):
            await link.close(1011, "panel error; reconnect")
    finally:
        link.closed = True
        try:
            await session.end()
        except Exception as exc:
            logger.warning("could not record an agent's disconnect", error=repr(exc))
        finally:
            link.ended.set()
