"""HTTP plumbing shared by the adapters: opening calls, bounded reads, probes.

Failures become ``UpstreamError`` with a short human reason (``failures``). Nothing is
read without a bound (``UpstreamLimits`` of the pool): an error body up to
``max_error_bytes`` and never further, so a failing upstream costs no more than a
succeeding one; a whole answer up to ``max_body_bytes``, a listing or probe up to
``max_listing_bytes``. A reply past its bound is refused as soon as its
``Content-Length`` or its bytes say so, and its connection is closed rather than
drained. Streamed answers are read by ``upstream_stream.UpstreamChatStream``.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import aiohttp
import msgspec
import structlog

from app.lib.http import (
    PROBE_TIMEOUT_SECONDS,
    Headers,
    UpstreamHttp,
    frozen_headers,
)
from app.lib.memory import LARGE_READ_BYTES
from app.routing.backends.failures import HTTP_ERRORS, describe_error, exchange_error
from app.routing.errors import (
    MAX_UPSTREAM_DETAIL_BYTES,
    UpstreamError,
    bounded_text,
)
from app.routing.types import Usage

JSON_HEADERS: Headers = frozen_headers(
    {"Content-Type": "application/json", "Accept": "application/json"}
)
PROBE_TIMEOUT_REASON = f"timeout after {PROBE_TIMEOUT_SECONDS}s"
logger = structlog.get_logger()


class PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class UsageFields(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None

    def to_usage(self) -> Usage | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None  # an empty object is no report at all
        prompt = self.prompt_tokens or 0
        details = self.prompt_tokens_details
        cached = 0 if details is None or details.cached_tokens is None else details.cached_tokens
        # Never more cached tokens than the prompt had (a confused upstream).
        return Usage(prompt, self.completion_tokens or 0, cached_tokens=max(0, min(cached, prompt)))


class ProbeAnswer(NamedTuple):
    """What a probe got back: the status and the whole (bounded) body."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


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
