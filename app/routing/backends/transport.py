"""HTTP plumbing shared by the adapters: opening calls, bounded error bodies, reasons.

Failures become ``UpstreamError`` with a short human reason; an error body is read up
to ``MAX_UPSTREAM_DETAIL_BYTES`` and never further, so a failing upstream costs no
more than a succeeding one.
"""

from __future__ import annotations

import abc
import asyncio
import errno
import socket
from typing import NamedTuple

import aiohttp
import msgspec

from app.lib.http import (
    NON_STREAM_DEADLINE_SECONDS,
    PROBE_TIMEOUT_SECONDS,
    Headers,
    UpstreamHttp,
    frozen_headers,
)
from app.routing.backends.base import ChatStream
from app.routing.errors import MAX_UPSTREAM_DETAIL_BYTES, StreamInterruptedError, UpstreamError
from app.routing.types import Usage

JSON_HEADERS: Headers = frozen_headers(
    {"Content-Type": "application/json", "Accept": "application/json"}
)
PROBE_TIMEOUT_REASON = f"timeout after {PROBE_TIMEOUT_SECONDS}s"
REASON_LIMIT = 200

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
    """What a probe got back: the status and the whole body."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def describe_error(exc: BaseException) -> str:
    """A short reason for a failed exchange, for health pages and error messages."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timeout"
    if isinstance(exc, TimeoutError):  # aiohttp's per-read timeout, among others
        return "read timeout"
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
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return _clip(f"protocol error: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):  # an unparsable status line or header
        return _clip(f"protocol error: {exc.message}")
    if isinstance(exc, aiohttp.NonHttpUrlClientError):
        return _clip(f"unsupported URL: {exc}")
    if isinstance(exc, aiohttp.InvalidURL):
        return _clip(f"invalid URL: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _clip(f"connect failed: {exc}")
    return _clip(str(exc) or type(exc).__name__)


def _clip(text: str) -> str:
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT] + "…"


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
        raise UpstreamError.transport(describe_error(exc)) from exc
    status = response.status
    if 200 <= status < 300:
        return response
    try:
        detail = await read_bounded(response)
    finally:
        release_or_close(response)
    raise UpstreamError.from_status(status, detail)


async def fetch(
    http: UpstreamHttp,
    url: str,
    data: bytes,
    headers: Headers,
    *,
    deadline: float = NON_STREAM_DEADLINE_SECONDS,
) -> tuple[int, bytes]:
    """POST and read the whole 2xx body within ``deadline`` seconds: (status, body)."""
    scope = asyncio.timeout(deadline)
    try:
        async with scope:
            response = await open_response(http, "POST", url, data=data, headers=headers)
            # read() returns the connection to the pool at the end of the body, and
            # closes it if the read fails or is cancelled.
            return response.status, await response.read()
    except HTTP_ERRORS as exc:
        if scope.expired():
            raise UpstreamError.transport(f"no complete answer within {deadline:g}s") from exc
        raise UpstreamError.transport(describe_error(exc)) from exc


async def probe_get(
    http: UpstreamHttp, url: str, headers: Headers | None = None
) -> ProbeAnswer | str:
    """GET ``url`` within the probe deadline: the answer, or why there is none."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            response = await http.session.request(
                "GET", url, headers=headers, allow_redirects=False
            )
            try:
                return ProbeAnswer(response.status, await response.read())
            finally:
                release_or_close(response)
    except TimeoutError:  # the deadline, or one of aiohttp's own timeouts
        return PROBE_TIMEOUT_REASON
    except HTTP_ERRORS as exc:
        return describe_error(exc)
    except Exception as exc:  # a probe reports, it never raises
        return _clip(f"probe failed: {exc!r}")


def invalid_json(status: int) -> UpstreamError:
    # A 2xx that is not JSON is a broken upstream; another backend may do better.
    return UpstreamError(f"upstream {status}: invalid JSON body", status=status, retryable=True)


class UpstreamChatStream(ChatStream):
    """Reads an upstream body as bytes arrive and hands each read to the subclass, which
    translates or relays it; owns the connection's release, errors and ``aclose``."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._read = response.content.readany  # whatever arrived, at once: b"" at the end
        self._finished = False
        self._closed = False

    def __aiter__(self) -> UpstreamChatStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._finished:
            try:
                chunk = await self._read()
            except Exception as exc:
                self._end()
                if self._closed:
                    break  # the caller closed the stream under us: end quietly
                if isinstance(exc, HTTP_ERRORS):
                    raise StreamInterruptedError(describe_error(exc)) from exc
                raise
            if not chunk:
                self._end()  # fully read: back to the pool
                out = self._at_end()
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
        """What to send the client for this read (b"" for nothing yet)."""

    @abc.abstractmethod
    def _at_end(self) -> bytes:
        """What to send once the upstream closed the body normally."""
