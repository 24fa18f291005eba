"""A fake evernight bridge agent: JSON-RPC ``Bridge.Connect`` over a WebSocket, answered
with a real local TCP forward to the service's address.

Tests and ``arona demo`` publish services (``publish(node, service, host, port)``);
``Bridge.Connect`` opens (or reuses) a forwarding listener on a free loopback port and
answers ``{"local_port": N}``. ``move(node, service)`` plays a remote restart: the
tunnel comes back on a new local port, while connections already forwarded through
the old one keep flowing until they end (so in-flight calls can finish).
``down = True`` makes the agent refuse every call with a JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from websockets.asyncio.server import ServerConnection, serve

LOOPBACK = "127.0.0.1"
COPY_CHUNK_BYTES = 64 * 1024
SERVICE_NOT_FOUND = -32001
AGENT_DOWN = -32002


@dataclass(slots=True)
class _Tunnel:
    target: tuple[str, int]
    listener: asyncio.Server | None = None
    pipes: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int | None:
        if self.listener is None:
            return None
        return int(self.listener.sockets[0].getsockname()[1])


class FakeEvernightBridge:
    def __init__(self) -> None:
        self._services: dict[tuple[str, str], tuple[str, int]] = {}
        self._tunnels: dict[tuple[str, str], _Tunnel] = {}
        self.down = False
        self.calls: list[dict[str, Any]] = []
        self.accepted: dict[int, int] = {}
        """Connections forwarded, by the local port they came in on."""
        self.url = ""

    def publish(self, node: str, service: str, host: str, port: int) -> None:
        """Make ``service`` on ``node`` reachable at ``host:port`` (the remote side)."""
        self._services[(node, service)] = (host, port)

    def local_port(self, node: str, service: str) -> int | None:
        tunnel = self._tunnels.get((node, service))
        return None if tunnel is None else tunnel.port

    async def move(self, node: str, service: str) -> int:
        """The remote side restarted: the tunnel reopens on a new local port."""
        tunnel = self._tunnels[(node, service)]
        old = tunnel.listener
        tunnel.listener = None
        port = await self._open(tunnel)
        if old is not None:
            old.close()  # stop accepting; forwarded connections keep flowing
        return port

    @contextlib.asynccontextmanager
    async def running(self, host: str = LOOPBACK, port: int = 0) -> AsyncIterator[str]:
        """Serve until the block exits; yields the agent's ``ws://`` URL."""
        async with serve(self._session, host, port) as server:
            bound = server.sockets[0].getsockname()[1]
            self.url = f"ws://{host}:{bound}/ws"
            try:
                yield self.url
            finally:
                await self.close_tunnels()

    async def close_tunnels(self) -> None:
        for tunnel in self._tunnels.values():
            if tunnel.listener is not None:
                tunnel.listener.close()
            for pipe in list(tunnel.pipes):
                pipe.cancel()
            await asyncio.gather(*tunnel.pipes, return_exceptions=True)
        self._tunnels.clear()

    async def _session(self, socket: ServerConnection) -> None:
        async for frame in socket:
            reply = await self._answer(frame)
            if reply is not None:
                await socket.send(msgspec.json.encode(reply).decode())

    async def _answer(self, frame: str | bytes) -> dict[str, Any] | None:
        try:
            request = msgspec.json.decode(frame)
        except msgspec.DecodeError:
            return _error(None, -32700, "parse error")
        if not isinstance(request, dict) or request.get("jsonrpc") != "2.0":
            return _error(None, -32600, "invalid request")
        request_id = request.get("id")
        self.calls.append(request)
        if request.get("method") != "Bridge.Connect":
            return _error(request_id, -32601, "method not found")
        if self.down:
            return _error(request_id, AGENT_DOWN, "bridge is down")
        params = request.get("params")
        node = params.get("node") if isinstance(params, dict) else None
        service = params.get("service") if isinstance(params, dict) else None
        key = (node, service)
        if not isinstance(node, str) or not isinstance(service, str):
            return _error(request_id, -32602, "node and service are required")
        if key not in self._services:
            return _error(request_id, SERVICE_NOT_FOUND, f"no service {service} on {node}")
        tunnel = self._tunnels.get(key)
        if tunnel is None or tunnel.target != self._services[key]:
            tunnel = self._tunnels[key] = _Tunnel(target=self._services[key])
        port = tunnel.port if tunnel.port is not None else await self._open(tunnel)
        return {"jsonrpc": "2.0", "id": request_id, "result": {"local_port": port}}

    async def _open(self, tunnel: _Tunnel) -> int:
        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            local_port = writer.get_extra_info("sockname")[1]
            self.accepted[local_port] = self.accepted.get(local_port, 0) + 1
            task = asyncio.current_task()
            assert task is not None
            tunnel.pipes.add(task)
            try:
                await _pipe_to(tunnel.target, reader, writer)
            finally:
                tunnel.pipes.discard(task)

        tunnel.listener = await asyncio.start_server(forward, LOOPBACK, 0)
        port = tunnel.port
        assert port is not None
        return port


async def _pipe_to(
    target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(COPY_CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
