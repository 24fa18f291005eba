"""An OpenAI-compatible upstream that misbehaves on purpose, one way at a time.

It speaks just enough of the API (``/v1/models``, ``/v1/chat/completions``,
``/v1/embeddings``, a vLLM-style ``/metrics``) to be registered as a backend or a
custom LLM, then answers as its ``mode`` says:

- ``well``: a correct, short answer (so a test can show the gateway recovers);
- ``oversize``: ``size`` bytes where a small answer belongs: a non-streamed body, the
  model listing, the metrics page, an error body (with ``status``), or one SSE line;
- ``garbage``: a body that is not what was asked for: HTML for a stream, text for a
  completion;
- ``invalid_frames``: an SSE stream whose ``data:`` lines are not JSON;
- ``wrong_shape``: valid JSON of the wrong shape (no ``choices``, no ``data``);
- ``upstream_error``: a stream that starts, then carries an ``{"error": ...}`` chunk;
- ``truncated``: a stream (or a body with a ``Content-Length``) that ends early but
  cleanly: no ``[DONE]``, no error;
- ``hung``: takes the request and never answers (until released or the client goes);
- ``stall``: a stream that sends its first chunk, then nothing more.

Large answers are sent in slices of one shared buffer, so the fake itself stays
small however many bytes it sends. ``declare_length`` adds a ``Content-Length`` to
oversize answers (the gateway can refuse those before reading); without it they are
chunked and must be cut while being read.

Steer it in-process through ``control``, or over HTTP with
``POST /__fake/control`` (``{"mode": "...", "size": N, "status": S,
"declare_length": true}``) and read ``GET /__fake/stats``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from app.fakes.asgi_io import Receive, Scope, Send, read_body, run_lifespan, send_bytes, send_json

Mode = Literal[
    "well",
    "oversize",
    "garbage",
    "invalid_frames",
    "wrong_shape",
    "upstream_error",
    "truncated",
    "hung",
    "stall",
]
SLICE_BYTES = 64 * 1024
JSON = (b"content-type", b"application/json")
SSE = (b"content-type", b"text/event-stream")
DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class HostileControl:
    mode: Mode = "well"
    size: int = 64 * 1024 * 1024
    """Bytes of an ``oversize`` answer."""
    status: int = 200
    """Status of ``oversize`` answers (a 5xx makes it an oversize error body)."""
    declare_length: bool = False


class HostilePatch(msgspec.Struct, forbid_unknown_fields=True):
    mode: Mode = "well"
    size: int = 64 * 1024 * 1024
    status: int = 200
    declare_length: bool = False


@dataclass(slots=True)
class HostileStats:
    requests: int = 0
    bytes_sent: int = 0
    disconnects: int = 0
    """Clients that went away before an answer ended (an oversize one, a hung one)."""


def _chunk(content: str, *, finish: str | None = None) -> bytes:
    delta = {"content": content} if content else {}
    chunk = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "hostile",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


def _completion(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 0,
        "model": "hostile",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


WELL_STREAM = (_chunk("Hello"), _chunk(" there"), _chunk("", finish="stop"), DONE)


class HostileUpstream:
    def __init__(self, name: str = "hostile", *, models: tuple[str, ...] = ("hostile",)) -> None:
        self.name = name
        self.models = list(models)
        self.control = HostileControl()
        self.stats = HostileStats()
        self._release = asyncio.Event()
        self._slice = b"x" * SLICE_BYTES

    def release(self) -> None:
        """Answer every hung request now (called on server shutdown)."""
        self._release.set()

    def reset(self) -> None:
        self.release()
        self._release = asyncio.Event()
        self.control = HostileControl()
        self.stats = HostileStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send, on_shutdown=self.release)
            return
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        path: str = scope["path"]
        if path.startswith("/__fake/"):
            await self._control_endpoint(scope["method"], path, raw, send)
            return
        self.stats.requests += 1
        body = _json_or_none(raw)
        streamed = isinstance(body, dict) and body.get("stream") is True
        watcher = asyncio.ensure_future(receive())  # completes when the client leaves
        try:
            await self._answer(path, streamed, send, watcher)
        except OSError:
            self.stats.disconnects += 1
        finally:
            watcher.cancel()

    async def _answer(
        self, path: str, streamed: bool, send: Send, gone: asyncio.Future[Any]
    ) -> None:
        mode = self.control.mode
        if mode == "hung" or (mode == "stall" and not streamed):
            await self._hold(gone)
            return
        if path.endswith("/models"):
            await self._listing(send, gone)
        elif path == "/metrics":
            await self._metrics(send, gone)
        elif path.endswith("/chat/completions"):
            await (self._stream(send, gone) if streamed else self._whole(send, gone, chat=True))
        elif path.endswith("/embeddings"):
            await self._whole(send, gone, chat=False)
        else:
            await send_json(send, 404, {"error": {"message": f"no route {path}"}})

    # -- answers ------------------------------------------------------------------

    async def _listing(self, send: Send, gone: asyncio.Future[Any]) -> None:
        if self.control.mode == "oversize":
            await self._oversize(send, gone, b'{"object":"list","data":[{"id":"')
            return
        data = [{"id": m, "object": "model", "owned_by": self.name} for m in self.models]
        await send_json(send, 200, {"object": "list", "data": data})

    async def _metrics(self, send: Send, gone: asyncio.Future[Any]) -> None:
        if self.control.mode == "oversize":
            await self._oversize(send, gone, b"# HELP padding\n# ", content_type=b"text/plain")
            return
        text = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        await send_bytes(send, 200, text, ((b"content-type", b"text/plain"),))

    async def _whole(self, send: Send, gone: asyncio.Future[Any], *, chat: bool) -> None:
        mode = self.control.mode
        if mode == "oversize":
            await self._oversize(send, gone, b'{"choices":[{"message":{"content":"')
        elif mode in ("garbage", "invalid_frames"):
            page = b"<html><body>502 Bad Gateway (but said 200)</body></html>"
            await send_bytes(send, 200, page, ((b"content-type", b"text/html"),))
        elif mode == "wrong_shape":
            await send_json(send, 200, {"result": "ok", "answer": [1, 2, 3]})
        elif mode == "truncated":
            whole = msgspec.json.encode(_completion("Hello there") if chat else _embedding())
            await self._start(send, 200, JSON, length=len(whole))
            await self._body(send, whole[: len(whole) // 2], more=False)
        else:
            await send_json(send, 200, _completion("Hello there") if chat else _embedding())

    async def _stream(self, send: Send, gone: asyncio.Future[Any]) -> None:
        mode = self.control.mode
        if mode == "oversize":
            await self._oversize(send, gone, b'data: {"choices":[{"delta":{"content":"', sse=True)
            return
        if mode == "garbage":
            page = b"<html><body>not an event stream</body></html>\n"
            await send_bytes(send, 200, page, ((b"content-type", b"text/html"),))
            return
        frames: tuple[bytes, ...]
        if mode == "invalid_frames":
            frames = (_chunk("Hello"), b"data: {not json at all\n\n", DONE)
        elif mode == "wrong_shape":
            frames = (b'data: {"result": "ok"}\n\n', b"data: [1, 2, 3]\n\n", DONE)
        elif mode == "upstream_error":
            error = {"error": {"message": "model crashed", "type": "server_error"}}
            frames = (_chunk("Hello"), b"data: " + msgspec.json.encode(error) + b"\n\n")
        elif mode == "truncated":
            frames = WELL_STREAM[:2]
        elif mode == "stall":
            frames = WELL_STREAM[:1]
        else:
            frames = WELL_STREAM
        await self._start(send, 200, SSE)
        for frame in frames:
            await self._body(send, frame)
        if mode == "stall":
            await self._hold(gone)
            return
        await self._body(send, b"", more=False)

    async def _oversize(
        self,
        send: Send,
        gone: asyncio.Future[Any],
        head: bytes,
        *,
        sse: bool = False,
        content_type: bytes = b"application/json",
    ) -> None:
        """``size`` bytes that look like the start of a real answer and never end."""
        size = max(self.control.size, len(head))
        status = self.control.status
        content = (b"content-type", b"text/event-stream" if sse else content_type)
        length = size if self.control.declare_length else None
        await self._start(send, status, content, length=length)
        await self._body(send, head)
        left = size - len(head)
        while left > 0 and not gone.done():
            piece = self._slice if left >= SLICE_BYTES else self._slice[:left]
            await self._body(send, piece)
            left -= len(piece)
            # A send to a peer that has gone returns at once without suspending: yield,
            # so the watcher that hears the disconnect gets to run.
            await asyncio.sleep(0)
        if gone.done():
            self.stats.disconnects += 1
            return
        await self._body(send, b"", more=False)

    async def _hold(self, gone: asyncio.Future[Any]) -> None:
        released = asyncio.ensure_future(self._release.wait())
        try:
            await asyncio.wait((gone, released), return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
        if gone.done():
            self.stats.disconnects += 1

    # -- plumbing -----------------------------------------------------------------

    async def _start(
        self, send: Send, status: int, content: tuple[bytes, bytes], *, length: int | None = None
    ) -> None:
        headers = [content]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def _body(self, send: Send, data: bytes, *, more: bool = True) -> None:
        self.stats.bytes_sent += len(data)
        await send({"type": "http.response.body", "body": data, "more_body": more})

    async def _control_endpoint(self, method: str, path: str, raw: bytes, send: Send) -> None:
        if method == "GET" and path == "/__fake/stats":
            await send_json(send, 200, self.snapshot())
            return
        if method == "POST" and path == "/__fake/control":
            try:
                patch = msgspec.json.decode(raw or b"{}", type=HostilePatch)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await send_json(send, 400, {"error": str(exc)})
                return
            self.control = HostileControl(**msgspec.structs.asdict(patch))
            await send_json(send, 200, self.snapshot())
            return
        await send_json(send, 404, {"error": "unknown control endpoint"})

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "control": dataclasses.asdict(self.control),
            "stats": dataclasses.asdict(self.stats),
        }


def _embedding() -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
        "model": "hostile",
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }


def _json_or_none(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None
