"""Fixtures and helpers of the JSON-RPC tests.

The app runs on a real loopback port (``live_server``) in the test's own event loop,
next to the fake MiniMax of ``video_support`` (a real HTTP server). Clients are real
too: ``httpx`` for ``POST /api/rpc`` and the SSE sidecar (streamed), and the
``websockets`` client for ``/api/rpc/ws``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar
from websockets.asyncio.client import ClientConnection, connect

from app.lib.settings import Settings
from tests.support.live_server import LiveApp, live_server
from tests.support.routing import ADMIN
from tests.support.settings import AppFactory
from tests.support.video import (
    Minimax,
    Tenant,
    add_minimax_backend,
    minimax,
    new_tenant,
    unique_model,
    video_pg_settings,
)

FRAME_TIMEOUT = 10.0
JOB_TIMEOUT = 30.0
TERMINAL = ("video.done", "video.failed")
PRICE = 0.25

__all__ = ["minimax", "video_pg_settings"]


@dataclass
class Replica(LiveApp):
    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/api/rpc/ws"


@contextlib.asynccontextmanager
async def serve(app: Litestar) -> AsyncIterator[Replica]:
    async with (
        live_server(app) as url,
        httpx.AsyncClient(base_url=url, timeout=FRAME_TIMEOUT) as http,
    ):
        yield Replica(url, app, http)


@pytest.fixture
async def server(video_pg_settings: Settings, make_app: AppFactory) -> AsyncIterator[Replica]:
    async with serve(make_app(video_pg_settings)) as replica:
        yield replica


@dataclass
class VideoSetup:
    """A tenant (project + API key) and a model served by the fake MiniMax, priced
    per call at ``PRICE``."""

    tenant: Tenant
    model: str
    backend: str


async def video_setup(replica: Replica, minimax: Minimax) -> VideoSetup:
    model = unique_model("rpc")
    backend = await add_minimax_backend(replica.http, minimax, model)
    response = await replica.http.put(
        f"/api/admin/video-prices/{model}",
        json={"mode": "per_call", "base": PRICE},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    return VideoSetup(await new_tenant(replica.http), model, backend)


_ids = itertools.count(1)


def request(method: str, params: Any = None, *, id: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id or next(_ids)}
    if params is not None:
        message["params"] = params
    return message


async def post_rpc(http: httpx.AsyncClient, headers: dict[str, str], body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return await http.post(
        "/api/rpc", content=content, headers={**headers, "content-type": "application/json"}
    )


async def call(
    http: httpx.AsyncClient, headers: dict[str, str], method: str, params: Any = None
) -> dict[str, Any]:
    """One request over HTTP; returns the whole response object."""
    message = request(method, params)
    response = await post_rpc(http, headers, message)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["jsonrpc"] == "2.0", answer
    assert answer["id"] == message["id"], answer
    return answer


def result(answer: dict[str, Any]) -> Any:
    assert "error" not in answer, answer
    return answer["result"]


def error(answer: dict[str, Any], code: int) -> dict[str, Any]:
    """The error object, checked to be well formed and of ``code``."""
    assert "result" not in answer, answer
    found: dict[str, Any] = answer["error"]
    assert found["code"] == code, answer
    assert isinstance(found["message"], str)
    assert found["message"]
    return found


@dataclass
class RpcSocket:
    """A JSON-RPC client over a real WebSocket; notifications are kept in arrival order."""

    ws: ClientConnection
    notifications: list[dict[str, Any]] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    """Every message received, in order (responses and notifications)."""
    seen: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    """Per stream, the notifications ``next_note`` handed out."""
    _cursors: dict[str, int] = field(default_factory=dict)

    async def send(self, message: Any) -> None:
        await self.ws.send(msgspec.json.encode(message).decode())

    async def recv(self, within: float = FRAME_TIMEOUT) -> Any:
        async with asyncio.timeout(within):
            raw = await self.ws.recv()
        message = msgspec.json.decode(raw)
        if isinstance(message, dict) and "method" in message and "id" not in message:
            self.notifications.append(message)
        self.log.append(message)
        return message

    async def answer(self, within: float = FRAME_TIMEOUT) -> Any:
        """The next message that is not a notification (a response or a batch)."""
        while True:
            message = await self.recv(within)
            if not (isinstance(message, dict) and "method" in message):
                return message

    async def call(self, method: str, params: Any = None) -> dict[str, Any]:
        message = request(method, params)
        await self.send(message)
        answer: dict[str, Any] = await self.answer()
        assert answer["id"] == message["id"], answer
        return answer

    async def next_note(
        self, stream_id: str, within: float = JOB_TIMEOUT
    ) -> tuple[str, dict[str, Any]]:
        """The next notification of ``stream_id`` (in arrival order)."""
        async with asyncio.timeout(within):
            while True:
                cursor = self._cursors.get(stream_id, 0)
                for index in range(cursor, len(self.notifications)):
                    note = self.notifications[index]
                    if note["params"].get("stream_id") == stream_id:
                        self._cursors[stream_id] = index + 1
                        pair = (note["method"], note["params"])
                        self.seen.setdefault(stream_id, []).append(pair)
                        return pair
                self._cursors[stream_id] = len(self.notifications)
                await self.recv(within)

    async def stream(
        self, stream_id: str, within: float = JOB_TIMEOUT
    ) -> list[tuple[str, dict[str, Any]]]:
        """Every notification of ``stream_id`` up to and including its terminal one
        (those read before with ``next_note`` included)."""
        seen = self.seen.setdefault(stream_id, [])
        while not (seen and seen[-1][0] in TERMINAL):
            await self.next_note(stream_id, within)
        return list(seen)

    async def quiet(self, seconds: float) -> None:
        """No message arrives for ``seconds``."""
        with contextlib.suppress(TimeoutError):
            message = await self.recv(seconds)
            raise AssertionError(f"unexpected message {message}")


@contextlib.asynccontextmanager
async def rpc_socket(
    replica: Replica, headers: dict[str, str], *, receive_buffer: int | None = None
) -> AsyncIterator[RpcSocket]:
    """A client socket; ``receive_buffer`` caps its kernel receive buffer and turns
    compression off (a client that stops reading then pushes back on the server
    after a few KB of the server's bytes, not after megabytes)."""
    options: dict[str, Any] = {}
    if receive_buffer is not None:
        options["compression"] = None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        # Before connecting: the TCP window is negotiated from it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        host, port = replica.url.removeprefix("http://").split(":")
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        options["sock"] = sock
    async with connect(replica.ws_url, additional_headers=headers, open_timeout=5, **options) as ws:
        yield RpcSocket(ws)


@dataclass
class SseStream:
    status: int
    content_type: str
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    comments: int = 0
    ended: bool = False


async def read_sse(
    http: httpx.AsyncClient,
    headers: dict[str, str],
    stream_id: str,
    *,
    within: float = JOB_TIMEOUT,
    opened: asyncio.Event | None = None,
) -> SseStream:
    """Read ``/api/rpc/events?session=`` until the server ends it (``ended``)."""
    async with (
        asyncio.timeout(within),
        http.stream(
            "GET", "/api/rpc/events", params={"session": stream_id}, headers=headers
        ) as response,
    ):
        out = SseStream(response.status_code, response.headers.get("content-type", ""))
        if opened is not None:
            opened.set()
        if response.status_code != 200:
            await response.aread()
            out.events.append(("http-error", response.json()))
            return out
        name = ""
        async for line in response.aiter_lines():
            if line.startswith(":"):
                out.comments += 1
            elif line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                out.events.append((name, msgspec.json.decode(line.removeprefix("data: "))))
        out.ended = True
        return out


def assert_forward_only(notes: list[tuple[str, dict[str, Any]]]) -> None:
    """Progress only grows, and exactly one terminal notification comes, last."""
    assert notes, "no notification"
    last = (-1, -1)
    for method, params in notes[:-1]:
        assert method == "video.progress", notes
        order = (1 if params["status"] == "running" else 0, params["progress"])
        assert order > last, notes
        last = order
    assert notes[-1][0] in TERMINAL, notes
    assert sum(1 for method, _ in notes if method in TERMINAL) == 1, notes


async def rest_job(replica: Replica, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    response = await replica.http.get(f"/v1/video/generations/{job_id}", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body
