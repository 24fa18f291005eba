"""Adapter for engines speaking CEP (JSON-RPC 2.0 over one WebSocket).

The connection is dialled on first use (a probe counts) and shared by every call;
when it drops, the callers of that moment get errors and the next call dials again
(see ``connection.py`` for what drops it). Answers become OpenAI's shapes.

Decisions worth knowing:

- ``spec.api_key`` is the handshake token. A call's override key (``call.api_key``)
  is not used: the connection, and so its token, is shared by every caller.
- An engine whose handshake says ``streaming: false`` still serves streaming clients:
  ``chat_stream`` calls ``Engine.Chat`` and sends the whole reply as one chunk.
- A client that stops reading a stream unregisters it and sends the optional
  ``Engine.ChatCancel`` notification (engines may ignore it).
- ``aclose()`` is graceful: new calls are refused at once (retryable, so the router
  picks the backend's replacement), calls and streams already running get up to
  ``drain_timeout`` seconds to finish, then the connection is closed under them.
- The probe dials with the connect timeout, then asks ``Engine.Models`` within the
  probe timeout; the ``embedding`` flag and context lengths of the listing are not
  used by routing (the adapter serves chat and embeddings as a whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec
import structlog

import app
from app.lib.errors import BadRequestError
from app.lib.http import (
    CONNECT_TIMEOUT_SECONDS,
    NON_STREAM_DEADLINE_SECONDS,
    PROBE_TIMEOUT_SECONDS,
    READ_TIMEOUT_SECONDS,
)
from app.routing.backends.base import Backend, ChatStream
from app.routing.backends.chunks import completion_id
from app.routing.backends.engine.connection import DEFAULT_STREAM_BUFFER, EngineConnection
from app.routing.backends.engine.protocol import (
    PROTOCOL_VERSIONS,
    ChatReply,
    ChatStartResult,
    EmbeddingsReply,
    ModelsReply,
    chat_completion,
    chat_params,
    embeddings_list,
    embeddings_params,
    handshake_params,
    text_of,
)
from app.routing.backends.engine.streams import EngineChatStream, StreamInbox, WholeReplyStream
from app.routing.errors import UpstreamError
from app.routing.types import (
    BackendSpec,
    Capability,
    ChatResult,
    EmbeddingResult,
    ProbeResult,
    UpstreamCall,
    decode_field,
)

DRAIN_TIMEOUT_SECONDS = 30.0
logger = structlog.get_logger()
ARONA_CAPABILITIES: dict[str, Any] = {
    "streaming": True,
    "embeddings": True,
    "cancel": True,
    "protocol_versions": list(PROTOCOL_VERSIONS),
}
"""What Arona can consume, sent in its handshake."""

T = TypeVar("T")


class EngineBackend(Backend):
    kind = "engine"
    capabilities: frozenset[Capability] = frozenset({"chat", "embeddings"})
    static_models_first = False
    """CEP: static ids are appended after the ones ``Engine.Models`` lists."""

    def __init__(
        self,
        spec: BackendSpec,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        request_timeout: float = NON_STREAM_DEADLINE_SECONDS,
        probe_timeout: float = PROBE_TIMEOUT_SECONDS,
        idle_timeout: float = READ_TIMEOUT_SECONDS,
        drain_timeout: float = DRAIN_TIMEOUT_SECONDS,
        stream_buffer: int = DEFAULT_STREAM_BUFFER,
    ) -> None:
        if urlsplit(spec.url).scheme.lower() not in ("ws", "wss"):
            raise BadRequestError(
                "engine backends need a ws:// or wss:// URL", code="invalid_url", param="url"
            )
        super().__init__(spec)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.probe_timeout = probe_timeout
        self.idle_timeout = idle_timeout
        self.drain_timeout = drain_timeout
        self.stream_buffer = stream_buffer
        self._handshake = handshake_params(spec.api_key, app.__version__, ARONA_CAPABILITIES)
        self._conn: EngineConnection | None = None
        self._dialing: asyncio.Task[EngineConnection] | None = None
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._closed = False

    # -- connection and in-flight accounting ------------------------------------------

    @property
    def connection(self) -> EngineConnection | None:
        """The current connection, if one is open (tests read its handshake)."""
        conn = self._conn
        return conn if conn is not None and not conn.closed else None

    @property
    def in_flight(self) -> int:
        """Calls and streams running on this adapter (what ``aclose`` waits for)."""
        return self._active

    @property
    def closing(self) -> bool:
        """True once ``aclose`` began: new calls are refused."""
        return self._closing

    def _enter(self) -> None:
        if self._closing:
            raise UpstreamError("engine backend is closing", status=None, retryable=True)
        self._active += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    async def _connection(self) -> EngineConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        dial = self._dialing
        if dial is None:
            dial = self._dialing = asyncio.get_running_loop().create_task(self._dial())
            dial.add_done_callback(_retrieve)
        # Shielded: a caller that gives up must not abort the dial the others await.
        try:
            return await asyncio.shield(dial)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if dial.cancelled() and task is not None and not task.cancelling():
                # aclose() gave up on the dial, not on this caller: a clean error.
                raise UpstreamError(
                    "engine backend is closed", status=None, retryable=True
                ) from None
            raise

    async def _dial(self) -> EngineConnection:
        try:
            conn = await EngineConnection.open(
                self.spec.url,
                self._handshake,
                deadline=self.connect_timeout,
                stream_buffer=self.stream_buffer,
            )
        finally:
            self._dialing = None
        if self._closed:
            await conn.aclose()
            raise UpstreamError("engine backend is closed", status=None, retryable=True)
        self._conn = conn
        return conn

    async def _request(
        self, conn: EngineConnection, method: str, params: Any, kind: type[T], deadline: float
    ) -> T:
        raw = await conn.request(method, params, deadline=deadline)
        try:
            return msgspec.json.decode(raw, type=kind)
        except msgspec.DecodeError:
            raise conn.violation(f"malformed {method} result from the engine") from None

    # -- the Backend interface ----------------------------------------------------------

    async def probe(self) -> ProbeResult:
        if self._closing:
            return ProbeResult(False, "adapter closing")
        try:
            conn = await self._connection()
            reply = await self._request(
                conn, "Engine.Models", {}, ModelsReply, deadline=self.probe_timeout
            )
        except UpstreamError as exc:
            return ProbeResult(False, exc.message)
        except Exception as exc:  # a probe reports, it never raises
            logger.warning("engine probe failed", url=self.spec.url, error=repr(exc))
            return ProbeResult(False, "probe failed: unexpected error")
        models = (entry.id.strip() for entry in reply.models)
        return ProbeResult(True, "ok", tuple(dict.fromkeys(m for m in models if m)))

    async def chat(self, call: UpstreamCall) -> ChatResult:
        self._enter()
        try:
            conn = await self._connection()
            params = chat_params(call.model, call.body, conn.protocol_version, conn.modalities)
            reply = await self._request(
                conn, "Engine.Chat", params, ChatReply, deadline=self.request_timeout
            )
        finally:
            self._leave()
        text = text_of(reply.content)
        usage = reply.usage.to_usage() if reply.usage is not None else None
        completion = chat_completion(completion_id(), call.model, int(time.time()), text, usage)
        chars = len(text) if usage is None else 0
        return ChatResult(msgspec.json.encode(completion), usage, completion_text_chars=chars)

    async def chat_stream(self, call: UpstreamCall) -> ChatStream:
        self._enter()
        try:
            conn = await self._connection()
            params = chat_params(call.model, call.body, conn.protocol_version, conn.modalities)
            if conn.capabilities.streaming:
                inbox = await self._start_stream(conn, params)
            else:
                reply = await self._request(
                    conn, "Engine.Chat", params, ChatReply, deadline=self.request_timeout
                )
        except BaseException:
            self._leave()
            raise
        if not conn.capabilities.streaming:
            self._leave()
            return WholeReplyStream(reply, call.model, include_usage=call.include_usage)

        def done(cancel: bool) -> None:
            conn.close_stream(inbox.stream_id, cancel=cancel)
            self._leave()

        return EngineChatStream(
            inbox,
            model=call.model,
            include_usage=call.include_usage,
            idle_timeout=self.idle_timeout,
            on_done=done,
        )

    async def _start_stream(self, conn: EngineConnection, params: dict[str, Any]) -> StreamInbox:
        stream_id = str(uuid.uuid4())
        inbox = conn.open_stream(stream_id)
        try:
            start = await self._request(
                conn,
                "Engine.ChatStart",
                {**params, "stream_id": stream_id},
                ChatStartResult,
                deadline=self.idle_timeout,
            )
            if not start.ok:
                raise UpstreamError(
                    f"engine refused the stream: {start.error or 'no reason given'}",
                    status=502,
                    retryable=True,
                )
            if start.stream_id not in (None, stream_id):
                raise UpstreamError(
                    f"engine started stream {start.stream_id!r} instead of {stream_id!r}",
                    status=502,
                    retryable=True,
                )
        except BaseException:
            conn.close_stream(stream_id, cancel=False)
            raise
        return inbox

    async def embed(self, call: UpstreamCall) -> EmbeddingResult:
        self._enter()
        try:
            conn = await self._connection()
            if not conn.capabilities.embeddings:
                raise UpstreamError(
                    "engine does not serve embeddings (handshake capabilities)",
                    status=501,
                    retryable=True,
                )
            params = embeddings_params(call.model, call.body)
            reply = await self._request(
                conn, "Engine.Embeddings", params, EmbeddingsReply, deadline=self.request_timeout
            )
        finally:
            self._leave()
        as_base64 = decode_field(call.body, "encoding_format") == "base64"
        out = embeddings_list(reply, call.model, as_base64=as_base64)
        usage = reply.usage.to_usage() if reply.usage is not None else None
        return EmbeddingResult(msgspec.json.encode(out), usage)

    async def aclose(self) -> None:
        """Refuse new calls, let running ones finish (up to ``drain_timeout``), close."""
        self._closing = True
        if self._active:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.drain_timeout):
                    await self._idle.wait()
        self._closed = True
        dial = self._dialing
        if dial is not None:
            dial.cancel()
            with contextlib.suppress(BaseException):
                await dial
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()


def _retrieve(task: asyncio.Task[EngineConnection]) -> None:
    # Every waiter may have gone away; the dial's failure must not be reported unseen.
    if not task.cancelled():
        task.exception()
