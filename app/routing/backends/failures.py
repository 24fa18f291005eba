"""Failed upstream exchanges in plain words: what a client, a health page or a log is
told when an HTTP exchange with an upstream fails, and the errors for a 2xx answer
that cannot be relayed. The exception's own text goes to the log, never to a client."""

from __future__ import annotations

import errno
import socket

import aiohttp
import structlog

from app.lib.http import UpstreamHttp
from app.lib.ssrf import refusal_of
from app.routing.errors import UpstreamError

REASON_LIMIT = 200
logger = structlog.get_logger()

HTTP_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError, TimeoutError)
"""What a failed exchange raises: aiohttp's errors, socket errors, its own timeouts
(``aiohttp.ServerTimeoutError`` is a ``TimeoutError``)."""

# aiohttp re-raises some socket errors as its own OSError subclasses, keeping the errno.
_ERRNO_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
}


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
        message = f"could not connect to the upstream within {seconds_allowed(timeout.connect)}"
    elif isinstance(exc, TimeoutError):
        message = f"the upstream did not answer within {seconds_allowed(timeout.sock_read)}"
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


def seconds_allowed(value: float | None) -> str:
    """A timeout for a message: "5s", or "the time allowed" when there is none."""
    return "the time allowed" if value is None else f"{value:g}s"


def _clip(text: str) -> str:
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT] + "…"


def invalid_json(status: int) -> UpstreamError:
    # A 2xx that is not JSON is a broken upstream; another backend may do better.
    return malformed(status, "invalid JSON body")


def malformed(status: int, what: str) -> UpstreamError:
    """A 2xx answer that cannot be relayed as one (not JSON, the wrong shape)."""
    return UpstreamError(f"upstream {status}: {what}", status=status, retryable=True)
