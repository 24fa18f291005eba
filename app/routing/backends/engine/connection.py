"""One CEP connection: dial, handshake, a single reader task, and routing of replies.

Every call of an engine backend shares one WebSocket. Requests carry JSON-RPC ids
(integers this connection issues in order) and streams carry the ``stream_id`` Arona
made up, so the reader hands each response to its waiting future and each
``Engine.ChatChunk`` to its stream's inbox.

Failure rules:

- Any failure of the connection itself (socket closed, a frame that is not JSON or
  not JSON-RPC, a malformed chunk, a response nobody could have asked for) *drops*
  it: every pending request and every open stream is woken at once with the reason,
  and the adapter dials a fresh connection for the next call.
- A response whose id this connection issued but no longer waits for (its caller
  timed out or went away) is a late answer and is ignored. A response to an id never
  issued means the engine has lost track of who asked what; nothing it says can then
  be trusted to reach the right caller, so that drops the connection.
- A chunk for an unknown ``stream_id`` (a stream that ended, was cancelled, or never
  was) is ignored: it must not cost the other streams their connection.
- A stream's inbox holds at most ``stream_buffer`` chunks. The reader never waits on
  a slow consumer (that would stall every other caller); a stream whose consumer falls
  that far behind is cut (``StreamInterruptedError``) and cancelled at the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Coroutine
from typing import Any

import msgspec
import structlog
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)

from app.routing.backends.engine.protocol import (
    PROTOCOL_VERSIONS,
    ChatChunk,
    EngineCapabilities,
    Frame,
    HandshakeResult,
    error_frame,
    notification_frame,
    request_frame,
    rpc_error,
)
from app.routing.backends.engine.streams import StreamInbox
from app.routing.errors import UpstreamError

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Largest frame accepted from an engine (a batch of embeddings can be big)."""
CLOSE_TIMEOUT_SECONDS = 2.0
DEFAULT_STREAM_BUFFER = 4096
HANDSHAKE_ID = 1
CHAT_CHUNK = "Engine.ChatChunk"
CHAT_CANCEL = "Engine.ChatCancel"
METHOD_NOT_FOUND = -32601

logger = structlog.get_logger()


class EngineConnection:
    """An open, handshaken connection; build it with ``EngineConnection.open``."""

    def __init__(
        self,
        ws: ClientConnection,
        handshake: HandshakeResult,
        *,
        url: str,
        stream_buffer: int = DEFAULT_STREAM_BUFFER,
    ) -> None:
        self._ws = ws
        self.url = url
        self.protocol_version = handshake.protocol_version
        self.capabilities = handshake.capabilities or EngineCapabilities()
        self.modalities = frozenset(self.capabilities.modalities or ("text",))
        self._stream_buffer = stream_buffer
        self._ids = itertools.count(HANDSHAKE_ID + 1)
        self._last_id = HANDSHAKE_ID
        self._pending: dict[int, asyncio.Future[Frame | None]] = {}
        self._streams: dict[str, StreamInbox] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._warned_stray = False
        self.dropped: str | None = None
        """Why the connection is no longer usable (None while it is)."""
        self._reader = asyncio.create_task(self._read())

    # -- opening ---------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        url: str,
        handshake: dict[str, Any],
        *,
        deadline: float,
        stream_buffer: int = DEFAULT_STREAM_BUFFER,
    ) -> EngineConnection:
        """Dial ``url`` and handshake within ``deadline`` seconds, or raise ``UpstreamError``."""
        ws: ClientConnection | None = None
        try:
            async with asyncio.timeout(deadline):
                ws = await connect(
                    url,
                    open_timeout=None,  # the enclosing timeout covers dial and handshake
                    proxy=None,  # registered URLs are dialled directly, like HTTP upstreams
                    compression=None,  # tokens are tiny; deflate would only cost CPU
                    max_size=MAX_FRAME_BYTES,
                    close_timeout=CLOSE_TIMEOUT_SECONDS,
                    user_agent_header="arona",
                )
                result = await _handshake(ws, handshake)
        except TimeoutError:
            await _abort(ws)
            raise UpstreamError.transport(f"no handshake within {deadline:g}s") from None
        except UpstreamError:
            await _abort(ws)
            raise
        except BaseException as exc:
            await _abort(ws)
            if isinstance(exc, InvalidStatus) and exc.response.status_code == 429:
                raise _throttled(exc) from exc
            if isinstance(exc, OSError | WebSocketException):
                raise UpstreamError.transport(_dial_reason(exc)) from exc
            raise
        return cls(ws, result, url=url, stream_buffer=stream_buffer)

    # -- calls -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.dropped is not None

    def _check_open(self) -> None:
        if self.dropped is not None:
            raise UpstreamError.transport(self.dropped)

    async def request(self, method: str, params: Any, *, deadline: float) -> msgspec.Raw:
        """Send a request and return its raw result; ``UpstreamError`` on an error answer,
        a dropped connection or no answer within ``deadline`` seconds."""
        self._check_open()
        request_id = next(self._ids)
        self._last_id = request_id
        future: asyncio.Future[Frame | None] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send(request_frame(request_id, method, params))
            async with asyncio.timeout(deadline):
                frame = await future
        except TimeoutError:
            raise UpstreamError.transport(f"no answer to {method} within {deadline:g}s") from None
        finally:
            self._pending.pop(request_id, None)
        if frame is None:
            raise UpstreamError.transport(self.dropped or "connection dropped")
        if frame.error is not None:
            raise rpc_error(frame.error)
        return frame.result

    def open_stream(self, stream_id: str) -> StreamInbox:
        """Register a stream before it is started, so no early chunk can be missed."""
        self._check_open()
        inbox = StreamInbox(stream_id, self._stream_buffer)
        self._streams[stream_id] = inbox
        return inbox

    def close_stream(self, stream_id: str, *, cancel: bool) -> None:
        """Forget a stream; with ``cancel`` tell the engine it may stop generating (a
        notification engines may ignore; its delivery is best effort)."""
        inbox = self._streams.pop(stream_id, None)
        if inbox is not None:
            inbox.fail("stream closed")
        if cancel and self.dropped is None:
            self._spawn(self._send(notification_frame(CHAT_CANCEL, {"stream_id": stream_id})))

    def violation(self, reason: str) -> UpstreamError:
        """Drop the connection for a protocol violation found by a caller (an answer
        that does not decode); the error to raise to that caller."""
        self.drop(reason)
        self._spawn(self._close())
        return UpstreamError.transport(reason)

    async def _send(self, data: bytes) -> None:
        try:
            await self._ws.send(data, text=True)
        except ConnectionClosed as exc:
            self.drop(_closed_reason(exc))
            raise UpstreamError.transport(self.dropped or "connection closed") from exc

    # -- reading ---------------------------------------------------------------------

    async def _read(self) -> None:
        reason = "connection closed by the engine"
        try:
            async for message in self._ws:
                problem = self._dispatch(message)
                if problem is not None:
                    reason = problem
                    break
        except ConnectionClosed as exc:
            reason = _closed_reason(exc)
        except Exception as exc:  # the reader must never die silently: waiters would hang
            logger.warning("engine reader failed", url=self.url, error=repr(exc))
            reason = "the connection to the engine failed"
        self.drop(reason)
        await self._close()

    def _dispatch(self, message: str | bytes) -> str | None:
        """Route one frame; the reason to drop the connection, or None."""
        try:
            frame = msgspec.json.decode(message, type=Frame)
        except msgspec.ValidationError:
            return "malformed frame from the engine (not JSON-RPC)"
        except msgspec.DecodeError:
            return "malformed frame from the engine (not JSON)"
        if not frame.valid:
            return "malformed frame from the engine (not JSON-RPC)"
        if frame.method is None:
            return self._resolve(frame)
        if frame.method == CHAT_CHUNK:
            return self._route_chunk(frame)
        if frame.id is not None:
            # Engines do not call Arona; answer as JSON-RPC says and carry on.
            reply = error_frame(frame.id, METHOD_NOT_FOUND, f"unknown method {frame.method}")
            self._spawn(self._send(reply))
        else:
            logger.debug("engine notification ignored", url=self.url, method=frame.method)
        return None

    def _resolve(self, frame: Frame) -> str | None:
        request_id = frame.id
        future = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if future is not None:
            if not future.done():
                future.set_result(frame)
            return None
        if isinstance(request_id, int) and HANDSHAKE_ID <= request_id <= self._last_id:
            logger.debug("late engine answer ignored", url=self.url, id=request_id)
            return None
        return f"engine answered request id {request_id!r}, which was never sent"

    def _route_chunk(self, frame: Frame) -> str | None:
        try:
            chunk = msgspec.json.decode(frame.params, type=ChatChunk)
        except msgspec.DecodeError:
            return f"malformed {CHAT_CHUNK} from the engine"
        inbox = self._streams.get(chunk.stream_id)
        if inbox is None:
            log = logger.debug if self._warned_stray else logger.warning
            self._warned_stray = True
            log("engine chunk for an unknown stream ignored", url=self.url, stream=chunk.stream_id)
            return None
        if chunk.is_complete:
            del self._streams[chunk.stream_id]  # later chunks for it are strays
        if not inbox.push(chunk):
            inbox.fail(f"client reading too slowly ({inbox.limit} chunks waiting)")
            self.close_stream(chunk.stream_id, cancel=not chunk.is_complete)
        return None

    # -- closing ---------------------------------------------------------------------

    def drop(self, reason: str) -> None:
        """Mark the connection dead and wake every waiter with ``reason`` (idempotent)."""
        if self.dropped is not None:
            return
        self.dropped = reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_result(None)
        streams, self._streams = self._streams, {}
        for inbox in streams.values():
            inbox.fail(reason)
        if not reason.startswith("closed by arona"):
            logger.warning("engine connection dropped", url=self.url, reason=reason)

    async def aclose(self, reason: str = "closed by arona") -> None:
        self.drop(reason)
        await self._close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        for task in list(self._tasks):
            task.cancel()

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(_quietly(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _handshake(ws: ClientConnection, params: dict[str, Any]) -> HandshakeResult:
    await ws.send(request_frame(HANDSHAKE_ID, "Engine.Handshake", params), text=True)
    try:
        frame = msgspec.json.decode(await ws.recv(), type=Frame)
    except msgspec.DecodeError:
        raise UpstreamError.transport("malformed handshake answer from the engine") from None
    if not frame.valid or frame.id != HANDSHAKE_ID or frame.method is not None:
        raise UpstreamError.transport("the engine did not answer the handshake first")
    if frame.error is not None:
        raise rpc_error(frame.error)
    try:
        result = msgspec.json.decode(frame.result, type=HandshakeResult)
    except msgspec.DecodeError:
        raise UpstreamError.transport("malformed handshake result from the engine") from None
    if not result.ok:
        detail = result.error or "no reason given"
        raise UpstreamError(f"engine refused the handshake: {detail}", status=None, retryable=True)
    if result.protocol_version not in PROTOCOL_VERSIONS:
        raise UpstreamError(
            f"engine chose protocol version {result.protocol_version}, "
            f"arona speaks {list(PROTOCOL_VERSIONS)}",
            status=None,
            retryable=True,
        )
    return result


async def _abort(ws: ClientConnection | None) -> None:
    if ws is not None:
        with contextlib.suppress(Exception):
            await ws.close()


async def _quietly(work: Coroutine[Any, Any, None]) -> None:
    # Best-effort sends (cancel notifications, replies to stray calls): a dead socket
    # is already handled by the reader.
    with contextlib.suppress(UpstreamError, ConnectionClosed, OSError):
        await work


def _closed_reason(exc: ConnectionClosed) -> str:
    frame = exc.rcvd or exc.sent
    if frame is None:
        return "connection lost"
    detail = f": {frame.reason}" if frame.reason else ""
    return f"connection closed (code {frame.code}{detail})"


def _throttled(exc: InvalidStatus) -> UpstreamError:
    """The engine refused the upgrade with a 429: throttling, told the way an HTTP
    upstream tells it, so its status and ``Retry-After`` reach the client as they do
    from an OpenAI-compatible backend (other refusals stay transport failures)."""
    retry_after = exc.response.headers.get("Retry-After")
    return UpstreamError.from_status(429, "websocket upgrade refused", retry_after=retry_after)


def _dial_reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, InvalidURI):
        return f"invalid engine URL: {exc.uri}"
    if isinstance(exc, InvalidStatus):
        return f"websocket upgrade refused: status {exc.response.status_code}"
    if isinstance(exc, ConnectionClosed):
        return f"{_closed_reason(exc)} during the handshake"
    # Anything else in plain words; the library's own text goes to the log only.
    logger.info("engine dial failed", error_type=type(exc).__name__, detail=str(exc)[:200])
    if isinstance(exc, InvalidHandshake):
        return "the websocket handshake failed"
    if isinstance(exc, OSError) and isinstance(exc.strerror, str) and exc.strerror:
        return f"could not connect: {exc.strerror.lower()}"
    return "could not connect"
