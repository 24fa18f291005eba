"""Helpers for the routing tests: raw bodies, SSE parsing, scripted upstreams, served
fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from app.fakes.asgi_io import Receive, Scope, Send, read_body
from app.fakes.common import FakeUpstream
from app.fakes.minimax_upstream import FakeMinimax
from app.routing.backends.base import ChatStream
from app.routing.backends.engine import EngineBackend
from app.routing.types import RawBody, UpstreamCall

CHAT_MESSAGES = [{"role": "user", "content": "Say hello"}]


def raw_body(payload: dict[str, Any]) -> RawBody:
    return msgspec.json.decode(msgspec.json.encode(payload), type=dict[str, msgspec.Raw])


def chat_call(
    model: str = "gpt-4o-mini",
    *,
    stream: bool = False,
    include_usage: bool = False,
    **fields: Any,
) -> UpstreamCall:
    payload: dict[str, Any] = {"model": "client-alias", "messages": CHAT_MESSAGES, **fields}
    if stream:
        payload["stream"] = True
        if include_usage:
            payload["stream_options"] = {"include_usage": True}
    return UpstreamCall(model, raw_body(payload), stream=stream, include_usage=include_usage)


async def collect(stream: ChatStream) -> bytes:
    return b"".join([chunk async for chunk in stream])


def sse_events(data: bytes) -> list[Any]:
    """Each SSE event's data: decoded JSON, or the string ``[DONE]``."""
    events: list[Any] = []
    for block in data.split(b"\n\n"):
        lines = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            assert not block.strip(), f"non-data block: {block!r}"
            continue
        payload = b"\n".join(lines)
        events.append("[DONE]" if payload == b"[DONE]" else msgspec.json.decode(payload))
    return events


def streamed_text(events: list[Any]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for event in events
        if isinstance(event, dict)
        for choice in event["choices"]
    )


class ScriptedUpstream:
    """Answers every request with ``status`` and ``pieces`` sent one by one.

    A short pause between pieces makes each one a separate network read in practice,
    which is how the tests split SSE lines across chunks. ``client_ports`` records the
    client's port per request, which tells a pooled connection from a new one;
    ``request_headers`` the headers received (lower-case names).
    """

    def __init__(
        self,
        pieces: Sequence[bytes],
        *,
        status: int = 200,
        content_type: bytes = b"text/event-stream",
        pause: float = 0.05,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        self.pieces = list(pieces)
        self.status = status
        self.content_type = content_type
        self.pause = pause
        self.headers = list(headers)
        self.paths: list[str] = []
        self.client_ports: list[int] = []
        self.request_headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        self.paths.append(scope["path"])
        self.client_ports.append(scope["client"][1])
        self.request_headers.append(dict(scope["headers"]))
        headers = [(b"content-type", self.content_type), *self.headers]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        for piece in self.pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if self.pause:
                await asyncio.sleep(self.pause)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Wait until ``condition()`` holds (a fake's counter catching up, say)."""
    step = 0.01
    for _ in range(int(within / step)):
        if condition():
            return
        await asyncio.sleep(step)
    raise AssertionError("condition not met in time")


async def drain_into(stream: ChatStream, received: list[bytes]) -> None:
    """Iterate ``stream`` to its end (or failure), keeping what arrived."""
    async for chunk in stream:
        received.append(chunk)


MINIMAX_KEY = "mm-secret-key"
"""The key the fake MiniMax of ``tests/routing/conftest.py`` requires."""


@dataclass
class ServedMinimax:
    fake: FakeMinimax
    url: str


F = TypeVar("F", bound=FakeUpstream)

UPSTREAM_KEY = "sk-upstream-secret"
PATH_PREFIX = "/api/paas/v4"


@dataclass
class Served(Generic[F]):
    fake: F
    url: str


EngineFactory = Callable[..., EngineBackend]
