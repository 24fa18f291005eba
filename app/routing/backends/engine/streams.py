"""Streams of an engine backend: the per-stream inbox the reader fills, and the
``ChatStream`` objects that turn what it holds into OpenAI SSE chunks."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from app.routing.backends.base import ChatStream
from app.routing.backends.chunks import DONE_FRAME, chunk_frame, completion_id, usage_json
from app.routing.backends.engine.protocol import ChatChunk, ChatReply, text_of
from app.routing.errors import StreamInterruptedError


class StreamInbox:
    """The chunks received for one stream and not yet read, or why no more will come."""

    __slots__ = ("_items", "_ready", "failure", "limit", "stream_id")

    def __init__(self, stream_id: str, limit: int) -> None:
        self.stream_id = stream_id
        self.limit = limit
        self.failure: str | None = None
        self._items: deque[ChatChunk] = deque()
        self._ready = asyncio.Event()

    def push(self, chunk: ChatChunk) -> bool:
        """Queue ``chunk``; False when the inbox is full (the consumer is too slow)."""
        if len(self._items) >= self.limit:
            return False
        self._items.append(chunk)
        self._ready.set()
        return True

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self._ready.set()

    async def take(self, idle_timeout: float) -> list[ChatChunk]:
        """Every chunk queued so far (at least one); chunks received before a failure
        are still handed out first. Raises ``StreamInterruptedError`` once failed, or
        after ``idle_timeout`` seconds without a chunk."""
        while not self._items:
            if self.failure is not None:
                raise StreamInterruptedError(self.failure)
            self._ready.clear()
            try:
                async with asyncio.timeout(idle_timeout):
                    await self._ready.wait()
            except TimeoutError:
                raise StreamInterruptedError(f"no chunk within {idle_timeout:g}s") from None
        items = list(self._items)
        self._items.clear()
        return items


class EngineChatStream(ChatStream):
    """Turns one stream's ``Engine.ChatChunk`` notifications into OpenAI SSE chunks."""

    def __init__(
        self,
        inbox: StreamInbox,
        *,
        model: str,
        include_usage: bool,
        idle_timeout: float,
        on_done: Callable[[bool], None],
    ) -> None:
        self._inbox = inbox
        self._model = model
        self._include_usage = include_usage
        self._idle_timeout = idle_timeout
        self._on_done: Callable[[bool], None] | None = on_done
        """Called once when the stream ends: unregisters it (cancelling it at the
        engine when True) and releases its place in the adapter's in-flight count."""
        self._id = completion_id()
        self._created = int(time.time())
        self._started = False
        self._ended = False

    @property
    def stream_id(self) -> str:
        return self._inbox.stream_id

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while not self._ended:
            try:
                chunks = await self._inbox.take(self._idle_timeout)
            except StreamInterruptedError:
                closed_by_us = self._on_done is None
                self._finish(cancel=True)
                if closed_by_us:
                    break  # aclose() from elsewhere: end quietly
                raise
            out = self._frames(chunks)
            if out:
                return out
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self._finish(cancel=True)

    def _finish(self, *, cancel: bool) -> None:
        self._ended = True
        done, self._on_done = self._on_done, None
        if done is not None:
            done(cancel)

    def _frames(self, chunks: list[ChatChunk]) -> bytes:
        final: ChatChunk | None = None
        texts: list[str] = []
        for chunk in chunks:
            texts.append(text_of(chunk.token))
            if chunk.is_complete:
                final = chunk
                break
        text = "".join(texts)
        delta: dict[str, Any] = {}
        if not self._started:
            self._started = True
            delta = {"role": "assistant", "content": ""}
        if text:
            delta["content"] = text
            self.completion_text_chars += len(text)
        frames: list[bytes] = []
        if delta:
            frames.append(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
        if final is not None:
            self.usage = final.usage.to_usage() if final.usage is not None else None
            frames.append(self._chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
            if self._include_usage and self.usage is not None:
                frames.append(self._chunk([], usage=usage_json(self.usage)))
            frames.append(DONE_FRAME)
            self._finish(cancel=False)
        return b"".join(frames)

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return chunk_frame(self._id, self._model, self._created, choices, **extra)


class WholeReplyStream(ChatStream):
    """A stream for an engine that cannot stream: its whole reply as one chunk."""

    def __init__(self, reply: ChatReply, model: str, *, include_usage: bool) -> None:
        chunk_id, created = completion_id(), int(time.time())
        text = text_of(reply.content)
        usage = reply.usage.to_usage() if reply.usage is not None else None
        self.usage = usage
        self.completion_text_chars = len(text)
        delta = {"role": "assistant", "content": text}
        frames = [
            chunk_frame(
                chunk_id,
                model,
                created,
                [{"index": 0, "delta": delta, "finish_reason": None}],
            ),
            chunk_frame(
                chunk_id, model, created, [{"index": 0, "delta": {}, "finish_reason": "stop"}]
            ),
        ]
        if include_usage and usage is not None:
            frames.append(chunk_frame(chunk_id, model, created, [], usage=usage_json(usage)))
        frames.append(DONE_FRAME)
        self._frames: list[bytes] | None = frames

    async def __aiter__(self) -> AsyncIterator[bytes]:
        frames, self._frames = self._frames, None
        for frame in frames or ():
            yield frame

    async def aclose(self) -> None:
        self._frames = None
