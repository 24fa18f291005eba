"""HTTP plumbing shared by the adapters: opening calls, bounded reads, reasons.

Failures become ``UpstreamError`` with a short human reason. Nothing is read without
a bound (``UpstreamLimits`` of the pool): an error body up to ``max_error_bytes`` and
never further, so a failing upstream costs no more than a succeeding one; a whole
answer up to ``max_body_bytes``, a listing or probe up to ``max_listing_bytes``. A
reply past its bound is refused as soon as its ``Content-Length`` or its bytes say so,
and its connection is closed rather than drained.
"""

from __future__ import annotations

import abc
import asyncio
import errno
import socket
from typing import NamedTuple

import aiohttp
import msgspec
import structlog

from app.lib.http import (
    PROBE_TIMEOUT_SECONDS,
    Headers,
    UpstreamHttp,
    UpstreamLimits,
    frozen_headers,
)
from app.lib.memory import LARGE_READ_BYTES
from app.lib.ssrf import refusal_of
from app.routing.backends.base import ChatStream
from app.routing.errors import (
    MAX_UPSTREAM_DETAIL_BYTES,
    StreamInterruptedError,
    UpstreamError,
    bounded_text,
)
from app.routing.types import Usage

JSON_HEADERS: Headers = frozen_headers(
    {"Content-Type": "application/json", "Accept": "application/json"}
)
PROBE_TIMEOUT_REASON = f"timeout after {PROBE_TIMEOUT_SECONDS}s"
REASON_LIMIT = 200
STREAM_CUT = "the upstream closed the stream before it ended"
logger = structlog.get_logger()

HTTP_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError, TimeoutError)
"""What a failed exchange raises: aiohttp's errors, socket errors, its own timeouts
(``aiohttp.ServerTimeoutError`` is a ``TimeoutError``)."""

# aiohttp re-raises some socket errors as its own OSError subclasses, keeping the errno.
_ERRNO_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
}


class UsageFields(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def to_usage(self) -> Usage | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None  # an empty object is no report at all
        return Usage(self.prompt_tokens or 0, self.completion_tokens or 0)


class ProbeAnswer(NamedTuple):
    """What a probe got back: the status and the whole (bounded) body."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def describe_error(exc: BaseException) -> str:
    """A short reason for a failed exchange, for health pages and error messages: plain
    words for the situation, never the exception's own text (which names library
    internals); callers log that where it helps."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timeout"
    if isinstance(exc, TimeoutError):  # aiohttp's per-read timeout, among others
        return "read timeout"
    refused = refusal_of(exc)
    if refused is not None:
        return _clip(f"address not allowed ({refused.reason.removeprefix('refused: ')})")
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "name resolution failed"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        if isinstance(cause, OSError) and cause.errno in _ERRNO_REASONS:
            return _ERRNO_REASONS[cause.errno]
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the upstream closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the upstream closed the connection before its answer ended"
    if isinstance(exc, aiohttp.ClientResponseError):  # an unparsable status line or header
        return "the upstream's answer is not valid HTTP"
    if isinstance(exc, aiohttp.NonHttpUrlClientError):
        return "unsupported URL scheme"
    if isinstance(exc, aiohttp.InvalidURL):
        return "invalid URL"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _with_os_reason("could not connect", exc.os_error)
    if isinstance(exc, OSError):
        return _with_os_reason("network error", exc)
    return "the exchange failed"


def _with_os_reason(what: str, error: OSError) -> str:
    # The operating system's words for an errno ("Network is unreachable") are plain.
    reason = error.strerror if isinstance(error.strerror, str) else None
    return _clip(f"{what}: {reason.lower()}") if reason else what


def _connecting(exc: BaseException) -> bool:
    """The connection was never established (nothing was sent)."""
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return True
    return describe_error(exc) in ("connection refused", "name resolution failed")


def exchange_error(exc: BaseException, http: UpstreamHttp) -> UpstreamError:
    """The client's error for an exchange that failed before an answer came: the
    situation in plain words (connect, wait, cut), the exception's own text logged."""
    timeout = http.timeout
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        message = f"could not connect to the upstream within {_seconds(timeout.connect)}"
    elif isinstance(exc, TimeoutError):
        message = f"the upstream did not answer within {_seconds(timeout.sock_read)}"
    elif _connecting(exc):
        message = f"could not connect to the upstream: {describe_error(exc)}"
    elif describe_error(exc) == "connection reset":
        message = "the upstream reset the connection"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        message = "the upstream closed the connection before it answered"
    elif isinstance(exc, aiohttp.ClientPayloadError):
        message = "the upstream closed the connection before its answer ended"
    else:
        message = f"the exchange with the upstream failed: {describe_error(exc)}"
    log_failure(exc, message)
    return UpstreamError(message, status=None, retryable=True)


def log_failure(exc: BaseException, message: str) -> None:
    """One line, no trace (the error path costs what the success path does): what the
    client was told, and the exception's own words for whoever debugs it."""
    logger.info(
        "upstream exchange failed",
        reason=message,
        error_type=type(exc).__name__,
        detail=_clip(str(exc)),
    )


def _seconds(value: float | None) -> str:
    return "the time allowed" if value is None else f"{value:g}s"


def _clip(text: str) -> str:
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT] + "…"


class BodyTooLargeError(Exception):
    """An answer passed its read bound; its connection must be closed, not pooled."""

    def __init__(self, limit: int, status: int) -> None:
        super().__init__(f"answer larger than {limit} bytes")
        self.limit = limit
        self.status = status

    def upstream_error(self) -> UpstreamError:
        # Retryable in a pool (another backend may answer within bounds); it carries
        # the upstream's status, so a single target (a custom LLM) is not asked again.
        return UpstreamError(
            f"upstream answer larger than the {self.limit}-byte limit",
            status=self.status,
            retryable=True,
        )


async def read_within(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, if it is at most ``limit`` bytes; raises ``BodyTooLargeError``
    as soon as the declared length or the bytes received pass it (the caller closes
    the connection: ``release_or_close`` does, since the body was not read to its end).
    """
    declared = response.content_length
    if declared is not None and declared > limit:
        raise BodyTooLargeError(limit, response.status)
    parts: list[bytes] = []
    size = 0
    read = response.content.readany
    while part := await read():
        size += len(part)
        if size > limit:
            raise BodyTooLargeError(limit, response.status)
        parts.append(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_bounded(
    response: aiohttp.ClientResponse, limit: int = MAX_UPSTREAM_DETAIL_BYTES
) -> bytes:
    """At most ``limit + 1`` bytes of the body (one more tells the reader it was cut)."""
    parts: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            part = await response.content.read(limit + 1 - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
    except HTTP_ERRORS:
        pass  # the status is what matters; a half-read error body is fine
    return b"".join(parts)


def release_or_close(response: aiohttp.ClientResponse) -> None:
    """Done with ``response``: a fully read one returns its connection to the pool; a
    partly read one closes it, so the upstream sees the client leave."""
    if response.content.at_eof():
        response.release()
    else:
        response.close()


async def open_response(
    http: UpstreamHttp,
    method: str,
    url: str,
    *,
    data: bytes | None = None,
    headers: Headers | None = None,
) -> aiohttp.ClientResponse:
    """Send a request and return the 2xx response with its body unread.

    Raises ``UpstreamError`` for transport failures and non-2xx answers (the body is
    read up to the detail limit, then the connection is released or closed). The
    caller owns the returned response and must ``release_or_close()`` it.
    """
    try:
        response = await http.session.request(
            method, url, data=data, headers=headers, allow_redirects=False
        )
    except HTTP_ERRORS as exc:
        raise exchange_error(exc, http) from exc
    status = response.status
    if 200 <= status < 300:
        return response
    limit = http.limits.max_error_bytes
    retry_after = response.headers.get("Retry-After") if status == 429 else None
    try:
        detail = await read_bounded(response, limit)
    finally:
        release_or_close(response)
    raise UpstreamError.from_status(status, bounded_text(detail, limit), retry_after=retry_after)


async def fetch(http: UpstreamHttp, url: str, data: bytes, headers: Headers) -> tuple[int, bytes]:
    """POST and read the whole 2xx body within the pool's deadline and body bound:
    (status, body)."""
    limits = http.limits
    deadline = limits.deadline_seconds
    scope = asyncio.timeout(deadline)
    try:
        async with scope:
            response = await open_response(http, "POST", url, data=data, headers=headers)
            try:
                body = await read_within(response, limits.max_body_bytes)
            finally:
                # Read to its end: back to the pool; cut short (too large, failed,
                # cancelled): closed, so its buffers go and the upstream stops sending.
                release_or_close(response)
            if len(body) >= LARGE_READ_BYTES:
                http.trimmer.request()
            return response.status, body
    except BodyTooLargeError as exc:
        http.trimmer.request()
        raise exc.upstream_error() from None
    except HTTP_ERRORS as exc:
        if scope.expired():
            message = f"the upstream did not complete its answer within {deadline:g}s"
            raise UpstreamError(message, status=None, retryable=True) from exc
        raise exchange_error(exc, http) from exc


async def probe_get(
    http: UpstreamHttp, url: str, headers: Headers | None = None
) -> ProbeAnswer | str:
    """GET ``url`` within the probe deadline and the listing bound: the answer, or why
    there is none."""
    limits = http.limits
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            response = await http.session.request(
                "GET", url, headers=headers, allow_redirects=False
            )
            try:
                ok = 200 <= response.status < 300
                limit = limits.max_listing_bytes if ok else limits.max_error_bytes
                body = await (read_within if ok else read_bounded)(response, limit)
                return ProbeAnswer(response.status, body)
            finally:
                release_or_close(response)
    except BodyTooLargeError as exc:
        http.trimmer.request()
        return f"answer larger than the {exc.limit}-byte limit"
    except TimeoutError:  # the deadline, or one of aiohttp's own timeouts
        return PROBE_TIMEOUT_REASON
    except HTTP_ERRORS as exc:
        return describe_error(exc)
    except Exception as exc:  # a probe reports, it never raises
        logger.warning("probe failed", url=url, error=repr(exc))
        return "probe failed: unexpected error"


def invalid_json(status: int) -> UpstreamError:
    # A 2xx that is not JSON is a broken upstream; another backend may do better.
    return malformed(status, "invalid JSON body")


def malformed(status: int, what: str) -> UpstreamError:
    """A 2xx answer that cannot be relayed as one (not JSON, the wrong shape)."""
    return UpstreamError(f"upstream {status}: {what}", status=status, retryable=True)


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

    def __aiter__(self) -> UpstreamChatStream:
        return self

    def interrupted(self, reason: str) -> StreamInterruptedError:
        """The failure of this stream for ``reason``, carrying the status it began with."""
        return StreamInterruptedError(reason, status=self._status)

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
            return f"the upstream sent no data within {_seconds(self._first_wait)}"
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
