"""Machinery shared by the fake upstreams: switches, request recording, the base class
(raw ASGI I/O is ``app.fakes.asgi_io``).

The fakes are plain ASGI callables (no framework) so a benchmark measures the gateway,
not the fake. Tests steer a fake in-process through its ``control`` attributes; a fake
in another process is steered over HTTP:

- ``POST /__fake/control`` with a JSON object of switch names (see ``FakeControl``),
  plus ``"reset": true`` to restore the constructor's defaults first;
- ``GET /__fake/stats`` for the counters, the current switches and the number of
  recorded requests.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from app.fakes.asgi_io import (
    JSON_HEADERS,
    Message,
    Receive,
    Scope,
    Send,
    parse_json,
    read_body,
    run_lifespan,
    send_bytes,
    send_json,
)

MAX_RECORDED_REQUESTS = 256
"""Recording keeps the newest requests only, so a long benchmark does not grow memory
(benchmarks with large prompts should switch ``record_requests`` off altogether)."""


@dataclass(slots=True)
class FakeControl:
    """The switches of a fake; tests assign them directly, other processes over HTTP.

    ``fail_status``: every API call answers this status with an error body whose
    message is ``fail_message``. ``hang``: API calls never answer (until the client
    goes away, ``reset()`` or server shutdown). ``listing_404``: the model listing
    answers 404. ``drop_stream_after``: a stream sends that many frames, then the
    connection is closed without the end of the body. ``report_usage``: False omits
    token usage everywhere. ``delay_seconds``: wait before answering;
    ``chunk_delay_seconds``: wait between stream frames. ``models``: the listing.
    ``content``: the reply text (None: "Hello from <name>"); ``chunks``: content
    frames per stream (a text shorter than that is repeated to fill them, in streamed
    and whole answers alike). ``record_requests``: keep the received requests.
    ``reject_stream_options``: answer 400 to a request carrying ``stream_options``, as
    some strict OpenAI-compatible servers do. ``retry_after``: the ``Retry-After``
    header of the ``fail_status`` answers (a throttling upstream's 429).
    ``cached_tokens``: prompt tokens reported as served from a prompt cache.
    """

    models: list[str]
    fail_status: int | None = None
    fail_message: str = "fake upstream failure"
    hang: bool = False
    listing_404: bool = False
    drop_stream_after: int | None = None
    report_usage: bool = True
    delay_seconds: float = 0.0
    chunk_delay_seconds: float = 0.0
    content: str | None = None
    chunks: int = 5
    record_requests: bool = True
    reject_stream_options: bool = False
    retry_after: str | None = None
    cached_tokens: int = 0
    """Reported as ``usage.prompt_tokens_details.cached_tokens`` of chat answers (at
    most the prompt's tokens) when not 0."""


class ControlPatch(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The body of ``POST /__fake/control``: only the switches to change."""

    reset: bool = False
    models: list[str] | msgspec.UnsetType = msgspec.UNSET
    fail_status: int | msgspec.UnsetType | None = msgspec.UNSET
    fail_message: str | msgspec.UnsetType = msgspec.UNSET
    hang: bool | msgspec.UnsetType = msgspec.UNSET
    listing_404: bool | msgspec.UnsetType = msgspec.UNSET
    drop_stream_after: int | msgspec.UnsetType | None = msgspec.UNSET
    report_usage: bool | msgspec.UnsetType = msgspec.UNSET
    delay_seconds: float | msgspec.UnsetType = msgspec.UNSET
    chunk_delay_seconds: float | msgspec.UnsetType = msgspec.UNSET
    content: str | msgspec.UnsetType | None = msgspec.UNSET
    chunks: int | msgspec.UnsetType = msgspec.UNSET
    record_requests: bool | msgspec.UnsetType = msgspec.UNSET
    reject_stream_options: bool | msgspec.UnsetType = msgspec.UNSET
    retry_after: str | msgspec.UnsetType | None = msgspec.UNSET
    cached_tokens: int | msgspec.UnsetType = msgspec.UNSET


@dataclass(slots=True)
class FakeStats:
    requests: int = 0
    """API requests received (control endpoints excluded)."""
    chats: int = 0
    streams: int = 0
    embeddings: int = 0
    listings: int = 0
    failures: int = 0
    """Requests answered with ``fail_status``."""
    unauthorized: int = 0
    completed_streams: int = 0
    dropped_streams: int = 0
    """Streams cut by ``drop_stream_after``."""
    disconnects: int = 0
    """Clients that went away before a stream or a hung request ended."""
    in_flight: int = 0


class RecordedRequest(NamedTuple):
    path: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: Any
    """The parsed JSON body (None when empty or not JSON)."""


@dataclass(slots=True)
class FakeRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    receive: Receive
    send: Send
    disconnect: asyncio.Future[Message] | None = field(default=None)
    """Completes when the client goes away (started lazily by long answers)."""

    def watch_disconnect(self) -> asyncio.Future[Message]:
        # The body is fully read, so the next ``receive()`` only returns once the
        # connection is lost (or the response completed).
        if self.disconnect is None:
            self.disconnect = asyncio.ensure_future(self.receive())
        return self.disconnect

    @property
    def disconnected(self) -> bool:
        return self.disconnect is not None and self.disconnect.done()

    def stop_watching(self) -> None:
        if self.disconnect is not None and not self.disconnect.done():
            self.disconnect.cancel()


Handler = Callable[[FakeRequest], Awaitable[None]]


class FakeUpstream(abc.ABC):
    """Base of the fakes: dispatch, recording, switches and the control endpoints."""

    def __init__(
        self,
        name: str,
        models: Iterable[str],
        api_key: str | None,
        *,
        chunks: int = 5,
        content: str | None = None,
    ) -> None:
        self.name = name
        self.api_key = api_key
        self._defaults = FakeControl(models=list(models), chunks=chunks, content=content)
        self.control = self._default_control()
        self.stats = FakeStats()
        self.requests: deque[RecordedRequest] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._release = asyncio.Event()
        self._routes: dict[tuple[str, str], Handler] = {}
        self._listing_paths: set[str] = set()

    # -- subclass hooks ----------------------------------------------------------

    @abc.abstractmethod
    def error_body(self, status: int, message: str) -> bytes:
        """The error body in the dialect this fake speaks (OpenAI's, Ollama's)."""

    def route(self, method: str, path: str, handler: Handler, *, listing: bool = False) -> None:
        self._routes[(method, path)] = handler
        if listing:
            self._listing_paths.add(path)

    # -- test helpers -------------------------------------------------------------

    def reply_text(self) -> str:
        content = self.control.content
        return f"Hello from {self.name}" if content is None else content

    def requests_for(self, path_suffix: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith(path_suffix)]

    def reset(self) -> None:
        """Restore the constructor's switches, clear records and counters, free hung calls."""
        self.release()
        self._release = asyncio.Event()
        self.control = self._default_control()
        # Requests still running (just released) settle against the new counters.
        self.stats = FakeStats(in_flight=self.stats.in_flight)
        self.requests.clear()

    def _default_control(self) -> FakeControl:
        return dataclasses.replace(self._defaults, models=list(self._defaults.models))

    def release(self) -> None:
        """Answer every hung request now (called on reset and server shutdown)."""
        self._release.set()

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stats": dataclasses.asdict(self.stats),
            "control": dataclasses.asdict(self.control),
            "recorded": len(self.requests),
        }

    # -- ASGI -----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        path: str = scope["path"]
        method: str = scope["method"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        request = FakeRequest(method, path, headers, parse_json(raw), receive, send)
        if path.startswith("/__fake/"):
            await self._control_endpoint(request)
            return
        self.stats.requests += 1
        self.stats.in_flight += 1
        try:
            if self.control.record_requests:
                self.requests.append(RecordedRequest(path, headers, request.body))
            await self._handle(request)
        finally:
            request.stop_watching()
            self.stats.in_flight -= 1

    async def _handle(self, request: FakeRequest) -> None:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            await self.send_error(request, 404, f"no route for {request.method} {request.path}")
            return
        expected = self.api_key
        if expected is not None and request.headers.get("authorization") != f"Bearer {expected}":
            self.stats.unauthorized += 1
            await self.send_error(request, 401, "Incorrect API key provided")
            return
        control = self.control
        if control.hang:
            if await self._hold(request, None):
                await self.send_error(request, 503, "fake released a hung request")
            return
        if control.delay_seconds > 0 and not await self._hold(request, control.delay_seconds):
            return
        if control.fail_status is not None:
            self.stats.failures += 1
            extra = () if control.retry_after is None else ((b"retry-after", control.retry_after),)
            await self.send_error(request, control.fail_status, control.fail_message, extra)
            return
        if control.listing_404 and request.path in self._listing_paths:
            await self.send_error(request, 404, "model listing not available")
            return
        await handler(request)

    async def _hold(self, request: FakeRequest, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: until released); False once the client went away.

        A client that gives up must free the handler at once, or a fake that was told
        to be slow would keep counting requests nobody waits for.
        """
        gone = request.watch_disconnect()
        released = asyncio.ensure_future(self._release.wait())
        waiters: list[asyncio.Future[Any]] = [gone, released]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
        if gone.done():
            self.stats.disconnects += 1
            return False
        return True

    async def _control_endpoint(self, request: FakeRequest) -> None:
        if request.method == "GET" and request.path == "/__fake/stats":
            await send_json(request.send, 200, self.snapshot())
            return
        if request.method == "POST" and request.path == "/__fake/control":
            try:
                patch = msgspec.convert(request.body or {}, ControlPatch)
            except msgspec.ValidationError as exc:
                await send_json(request.send, 400, {"error": str(exc)})
                return
            if patch.reset:
                self.reset()
            for name, value in msgspec.structs.asdict(patch).items():
                if name != "reset" and value is not msgspec.UNSET:
                    setattr(self.control, name, value)
            await send_json(request.send, 200, self.snapshot())
            return
        await send_json(request.send, 404, {"error": "unknown control endpoint"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await run_lifespan(receive, send, on_shutdown=self.release)

    # -- responses --------------------------------------------------------------------

    async def send_error(
        self,
        request: FakeRequest,
        status: int,
        message: str,
        headers: Iterable[tuple[bytes, str]] = (),
    ) -> None:
        extra = [(name, value.encode("latin-1")) for name, value in headers]
        body = self.error_body(status, message)
        await send_bytes(request.send, status, body, [*JSON_HEADERS, *extra])

    async def stream(
        self, request: FakeRequest, frames: Iterable[bytes], content_type: bytes
    ) -> None:
        """Send ``frames`` as one chunked body, honouring the drop and delay switches."""
        control = self.control
        drop_after = control.drop_stream_after
        delay = control.chunk_delay_seconds
        request.watch_disconnect()
        await request.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")],
            }
        )
        for sent, frame in enumerate(frames):
            if drop_after is not None and sent >= drop_after:
                # Returning with the body unfinished makes the server close the
                # connection: the client sees an incomplete chunked body.
                self.stats.dropped_streams += 1
                return
            if request.disconnected:
                self.stats.disconnects += 1
                return
            if self._release.is_set():
                return
            await request.send({"type": "http.response.body", "body": frame, "more_body": True})
            if delay > 0:
                await asyncio.sleep(delay)
        if request.disconnected:
            self.stats.disconnects += 1
            return
        await request.send({"type": "http.response.body", "body": b"", "more_body": False})
        self.stats.completed_streams += 1
