"""The base of the adapters' streamed answers: an upstream body read as bytes arrive,
with bounded waits, plain-worded interruptions and the connection released or closed."""

from __future__ import annotations

import abc

import aiohttp

from app.lib.http import UpstreamLimits
from app.routing.backends.base import ChatStream
from app.routing.backends.failures import (
    HTTP_ERRORS,
    describe_error,
    log_failure,
    seconds_allowed,
)
from app.routing.backends.transport import release_or_close
from app.routing.errors import StreamInterruptedError

STREAM_CUT = "the upstream closed the stream before it ended"


class UpstreamChatStream(ChatStream):
    """Reads an upstream body as bytes arrive and hands each read to the subclass, which
    translates or relays it; owns the connection's release, errors and ``aclose``.

    The wait for the first chunk is bounded by the pool's read timeout (a long prefill
    is normal); once it came, silence between two chunks by ``stream_idle_seconds``.
    """

    def __init__(self, response: aiohttp.ClientResponse, limits: UpstreamLimits) -> None:
        self._response = response
        self._status = response.status
        protocol = response.connection.protocol if response.connection is not None else None
        self._first_wait = protocol.read_timeout if protocol is not None else None
        """The read timeout that bounds the wait for the first chunk (for messages)."""
        self._read = response.content.readany  # whatever arrived, at once: b"" at the end
        self._finished = False
        self._closed = False
        self._receiving = False
        self._idle_seconds = limits.stream_idle_seconds
        self.max_line_bytes = limits.max_event_bytes
        """The longest line (SSE or NDJSON) the subclass accepts before failing."""
        self._tail = b""
        """The partial last line of the reads so far, waiting for its end."""

    def __aiter__(self) -> UpstreamChatStream:
        return self

    def interrupted(self, reason: str) -> StreamInterruptedError:
        """The failure of this stream for ``reason``, carrying the status it began with."""
        return StreamInterruptedError(reason, status=self._status)

    def whole_lines(self, chunk: bytes) -> bytes:
        """The complete lines this read finishes, each ending in a newline (b"" for none
        yet). Both wire formats are line-based and reads cut them anywhere, so a partial
        last line waits in ``_tail`` for the rest, bounded by ``max_line_bytes``."""
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1
        tail = data[cut:]
        if len(tail) > self.max_line_bytes:
            raise self.line_too_long()
        self._tail = tail
        return data[:cut]

    def line_too_long(self) -> StreamInterruptedError:
        limit = self.max_line_bytes
        return self.interrupted(f"the upstream sent a line longer than the {limit}-byte limit")

    async def __anext__(self) -> bytes:
        while not self._finished:
            try:
                chunk = await self._read()
            except Exception as exc:
                self._end()
                if self._closed:
                    break  # the caller closed the stream under us: end quietly
                if isinstance(exc, HTTP_ERRORS):
                    reason = self._cut_reason(exc)
                    log_failure(exc, reason)
                    raise self.interrupted(reason) from exc
                raise
            if not self._receiving:
                self._receiving = True
                self._tighten_read_timeout()
            if not chunk:
                self._end()  # fully read: back to the pool
                try:
                    out = self._at_end()
                except StreamInterruptedError:
                    self._finished = True
                    raise
                if out:
                    return out
                break
            try:
                out = self._on_chunk(chunk)
            except StreamInterruptedError:
                self._end()
                raise
            if out:
                return out
        raise StopAsyncIteration

    def _cut_reason(self, exc: BaseException) -> str:
        """Why the body stopped, in plain words."""
        if isinstance(exc, TimeoutError):
            if self._receiving:
                return f"the upstream sent no data for {self._idle_seconds:g}s"
            return f"the upstream sent no data within {seconds_allowed(self._first_wait)}"
        if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
            return STREAM_CUT
        if describe_error(exc) == "connection reset":
            return STREAM_CUT + " (connection reset)"
        return describe_error(exc)

    def _tighten_read_timeout(self) -> None:
        # aiohttp restarts its per-read timer on every received packet; from now on it
        # runs with the idle bound. The connection's next request sets its own again.
        connection = self._response.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is not None:
            protocol.read_timeout = self._idle_seconds
            # Restart the timer now, unless reading is paused (a full buffer: the
            # timer is off then, as the silence is ours, not the upstream's).
            if not getattr(protocol, "_reading_paused", False):
                protocol.start_timeout()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A partly read response closes its connection instead of pooling it, so the
        # upstream sees the disconnect and stops generating.
        self._end()

    def _end(self) -> None:
        self._finished = True
        release_or_close(self._response)

    @abc.abstractmethod
    def _on_chunk(self, chunk: bytes) -> bytes:
        """What to send the client for this read (b"" for nothing yet); raises
        ``StreamInterruptedError`` for what cannot be relayed."""

    @abc.abstractmethod
    def _at_end(self) -> bytes:
        """What to send once the upstream closed the body normally; raises
        ``StreamInterruptedError`` if the stream was not complete."""
