"""HTTP plumbing shared by the adapters: opening calls, bounded error bodies, reasons.

Failures become ``UpstreamError`` with a short human reason; an error body is read up
to ``MAX_UPSTREAM_DETAIL_BYTES`` and never further, so a failing upstream costs no
more than a succeeding one.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from types import MappingProxyType

import httpx
import msgspec

from app.lib.http import NON_STREAM_DEADLINE_SECONDS, PROBE_TIMEOUT_SECONDS
from app.routing.errors import MAX_UPSTREAM_DETAIL_BYTES, UpstreamError
from app.routing.types import Usage

JSON_HEADERS: Mapping[str, str] = MappingProxyType(
    {"Content-Type": "application/json", "Accept": "application/json"}
)
PROBE_TIMEOUT = httpx.Timeout(PROBE_TIMEOUT_SECONDS)
PROBE_TIMEOUT_REASON = f"timeout after {PROBE_TIMEOUT_SECONDS}s"
REASON_LIMIT = 200

HTTP_ERRORS = (httpx.HTTPError, httpx.InvalidURL)
"""What the client raises for an unusable URL or a failed exchange."""


class UsageFields(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def to_usage(self) -> Usage | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None  # an empty object is no report at all
        return Usage(self.prompt_tokens or 0, self.completion_tokens or 0)


def describe_error(exc: BaseException) -> str:
    """A short reason for a failed exchange, for health pages and error messages."""
    timeouts: tuple[tuple[type[BaseException], str], ...] = (
        (httpx.ConnectTimeout, "connect timeout"),
        (httpx.ReadTimeout, "read timeout"),
        (httpx.WriteTimeout, "write timeout"),
        (httpx.PoolTimeout, "no free connection in the pool"),
    )
    for kind, reason in timeouts:
        if isinstance(exc, kind):
            return reason
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "name resolution failed"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx.RemoteProtocolError):
        return _clip(f"protocol error: {exc}")
    if isinstance(exc, httpx.ConnectError):
        return _clip(f"connect failed: {exc}")
    return _clip(str(exc) or type(exc).__name__)


def _clip(text: str) -> str:
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT] + "…"


async def read_bounded(response: httpx.Response, limit: int = MAX_UPSTREAM_DETAIL_BYTES) -> bytes:
    """At most ``limit + 1`` bytes of the body (one more tells the reader it was cut)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for part in response.aiter_bytes():
            parts.append(part)
            size += len(part)
            if size > limit:
                break
    except httpx.HTTPError:
        pass  # the status is what matters; a half-read error body is fine
    return b"".join(parts)[: limit + 1]


async def open_response(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> httpx.Response:
    """Send a request and return the 2xx response with its body unread.

    Raises ``UpstreamError`` for transport failures and non-2xx answers (the body is
    read up to the detail limit, then the connection is released).
    """
    try:
        request = http.build_request(method, url, content=content, headers=headers)
        response = await http.send(request, stream=True)
    except HTTP_ERRORS as exc:
        raise UpstreamError.transport(describe_error(exc)) from exc
    if response.is_success:
        return response
    try:
        detail = await read_bounded(response)
    finally:
        await response.aclose()
    raise UpstreamError.from_status(response.status_code, detail)


async def fetch(
    http: httpx.AsyncClient,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    *,
    deadline: float = NON_STREAM_DEADLINE_SECONDS,
) -> tuple[int, bytes]:
    """POST and read the whole 2xx body within ``deadline`` seconds: (status, body)."""
    try:
        async with asyncio.timeout(deadline):
            response = await open_response(http, "POST", url, content=content, headers=headers)
            try:
                return response.status_code, await response.aread()
            finally:
                await response.aclose()
    except TimeoutError as exc:
        raise UpstreamError.transport(f"no complete answer within {deadline:g}s") from exc
    except HTTP_ERRORS as exc:
        raise UpstreamError.transport(describe_error(exc)) from exc


async def probe_get(
    http: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None = None
) -> httpx.Response | str:
    """GET ``url`` within the probe deadline: the response, or why there is none."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            return await http.get(url, headers=headers, timeout=PROBE_TIMEOUT)
    except (TimeoutError, httpx.TimeoutException):
        return PROBE_TIMEOUT_REASON
    except HTTP_ERRORS as exc:
        return describe_error(exc)
    except Exception as exc:  # a probe reports, it never raises
        return _clip(f"probe failed: {exc!r}")


def invalid_json(status: int) -> UpstreamError:
    # A 2xx that is not JSON is a broken upstream; another backend may do better.
    return UpstreamError(f"upstream {status}: invalid JSON body", status=status, retryable=True)
