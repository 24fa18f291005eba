"""A ``BatchingEngine`` behind HTTP, in (scaled) real time: a vLLM server to route to.

It answers what a gateway uses: ``POST /v1/chat/completions`` (streamed or not),
``GET /v1/models`` and ``GET /metrics`` (vLLM's names). A request's prompt is as many
tokens as its messages have words and it produces exactly ``max_tokens`` tokens, so a
benchmark decides every request's size. A client that goes away aborts its request.

``time_scale`` runs the engine faster than real time: with 2.0 a step of 20 ms takes
10 ms of wall time, and every time the engine reports (``clock()``, the request
records) is in engine seconds, so figures read as if the run took twice as long.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec

from app.fakes.asgi_io import Receive, Scope, Send, read_body, send_bytes, send_json
from app.fakes.batching_engine import BatchingEngine, EngineRequest

SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
PROMETHEUS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
DEFAULT_MAX_TOKENS = 64


def prompt_tokens_of(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 1
    words = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += len(content.split())
    return max(1, words)


class BatchingEngineServer:
    def __init__(
        self,
        engine: BatchingEngine,
        model: str,
        *,
        time_scale: float = 1.0,
        chunk_tokens: int = 8,
    ) -> None:
        self.engine = engine
        self.model = model
        self.time_scale = time_scale
        self.chunk_tokens = max(1, chunk_tokens)
        self.scrapes = 0
        self._origin: float | None = None
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None

    def clock(self) -> float:
        """Engine seconds since the server started."""
        loop_time = asyncio.get_running_loop().time()
        if self._origin is None:
            self._origin = loop_time
        return (loop_time - self._origin) * self.time_scale

    # -- the engine's own loop -----------------------------------------------------------

    def start(self) -> None:
        if self._driver is None:
            self.clock()
            self._driver = asyncio.create_task(self._drive(), name=f"engine:{self.engine.name}")

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None

    async def _drive(self) -> None:
        engine = self.engine
        while True:
            seconds = engine.start_step(self.clock())
            if seconds is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(seconds / self.time_scale)
            engine.finish_step(self.clock())

    # -- HTTP ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        self.start()
        path = scope["path"]
        raw = await read_body(receive)
        if path == "/metrics":
            self.scrapes += 1
            text = self.engine.metrics_text(self.model).encode()
            await send_bytes(send, 200, text, PROMETHEUS)
        elif path.endswith("/models"):
            data = [{"id": self.model, "object": "model", "owned_by": self.engine.name}]
            await send_json(send, 200, {"object": "list", "data": data})
        elif path.endswith("/chat/completions"):
            await self._chat(raw, receive, send)
        else:
            await send_json(send, 404, {"error": {"message": f"no route {path}"}})

    async def _chat(self, raw: bytes, receive: Receive, send: Send) -> None:
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            await send_json(send, 400, {"error": {"message": "invalid JSON"}})
            return
        output = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
        gone = asyncio.ensure_future(receive())  # completes when the client leaves
        steps = _Steps(gone)
        request = self.engine.submit(prompt_tokens_of(body), int(output), self.clock(), steps.sink)
        self._wake.set()
        try:
            if body.get("stream") is True:
                await self._stream(request, steps, send)
            else:
                await self._whole(request, steps, send)
        except OSError:
            pass
        finally:
            gone.cancel()
            if request.finished is None:
                self.engine.abort(request, self.clock())

    async def _whole(self, request: EngineRequest, steps: _Steps, send: Send) -> None:
        while True:
            step = await steps.next()
            if step is None:
                return
            if step[1]:
                break
        answer = {
            "id": f"chatcmpl-{self.engine.name}-{request.id}",
            "object": "chat.completion",
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x " * request.generated},
                    "finish_reason": "length",
                }
            ],
            "usage": _usage(request),
        }
        await send_json(send, 200, answer)

    async def _stream(self, request: EngineRequest, steps: _Steps, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        pending = 0
        sent_first = False
        chunk_id = f"chatcmpl-{self.engine.name}-{request.id}"
        while True:
            step = await steps.next()
            if step is None:
                return
            produced, done = step
            pending += produced
            if done or not sent_first or pending >= self.chunk_tokens:
                await self._frame(send, chunk_id, {"content": "x " * pending}, None)
                pending, sent_first = 0, True
            if done:
                break
        await self._frame(send, chunk_id, {}, "length")
        usage: dict[str, Any] = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "model": self.model,
            "choices": [],
            "usage": _usage(request),
        }
        await _send(send, b"data: " + msgspec.json.encode(usage) + b"\n\n")
        await _send(send, b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _frame(
        self, send: Send, chunk_id: str, delta: dict[str, str], finish: str | None
    ) -> None:
        chunk = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        await _send(send, b"data: " + msgspec.json.encode(chunk) + b"\n\n")


class _Steps:
    """One request's steps as the engine runs them: (tokens produced, finished)."""

    __slots__ = ("_gone", "_tokens")

    def __init__(self, gone: asyncio.Future[Any]) -> None:
        self._tokens: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
        self._gone = gone

    def sink(self, _: EngineRequest, produced: int, done: bool) -> None:
        self._tokens.put_nowait((produced, done))

    async def next(self) -> tuple[int, bool] | None:
        """The next step's tokens, or None once the client is gone."""
        if not self._tokens.empty():
            return self._tokens.get_nowait()
        getter = asyncio.ensure_future(self._tokens.get())
        await asyncio.wait((getter, self._gone), return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        return None


async def _send(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


def _usage(request: EngineRequest) -> dict[str, int]:
    return {
        "prompt_tokens": request.prompt_tokens,
        "completion_tokens": request.generated,
        "total_tokens": request.prompt_tokens + request.generated,
    }
