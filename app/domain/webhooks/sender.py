"""One webhook attempt over the wire: POST the body, read the start of the answer.

The pool is the SSRF-guarded one (``app.lib.http.GuardedUpstreamHttp``): every
connection, whatever the URL's name resolves to at that moment, is checked against the
webhook policy; redirects are never followed (a 3xx is a failed attempt, and the
receiver is told nothing more). An attempt has one overall deadline, and at most
``EXCERPT_BYTES`` of the answer are read; the rest is never downloaded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from app.lib.http import GuardedUpstreamHttp
from app.lib.ssrf import refusal_of

EXCERPT_BYTES = 1024
"""Read from an answer, at most."""
EXCERPT_CHARS = 300
"""Kept of it (the row's ``last_response``)."""
ERROR_CHARS = 300
USER_AGENT = "arona-webhooks/1"


@dataclass(frozen=True, slots=True)
class AttemptResult:
    status_code: int | None
    """The receiver's status; None when no answer came."""
    error: str | None
    """Why the attempt failed, in plain words; None when it was delivered."""
    response: str | None
    """The start of the answer body, printable characters only."""
    duration_ms: int
    permanent: bool = False
    """Retrying cannot help (the address is refused by policy)."""

    @property
    def delivered(self) -> bool:
        return self.error is None


def _printable(raw: bytes) -> str | None:
    text = raw.decode("utf-8", "replace")
    cleaned = "".join(c if c.isprintable() else " " for c in text).strip()
    return cleaned[:EXCERPT_CHARS] or None


def _short(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def describe_failure(exc: BaseException, url: str, timeout: float) -> tuple[str, bool]:
    """A failed request as (message, permanent)."""
    refused = refusal_of(exc)
    if refused is not None:
        return _short(f"refused by the address policy: {refused.reason}"), True
    host = urlsplit(url).hostname or url
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s", False
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return _short(f"the certificate of {host} was refused: {exc.certificate_error}"), False
    if isinstance(exc, aiohttp.ClientSSLError):
        return _short(f"TLS with {host} failed: {exc}"), False
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error)
        return _short(f"could not connect to {host}: {reason}"), False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"{host} closed the connection without answering", False
    return _short(f"the request to {host} failed: {exc or type(exc).__name__}"), False


class WebhookSender:
    __slots__ = ("_http", "timeout")

    def __init__(self, http: GuardedUpstreamHttp, timeout: float) -> None:
        self._http = http
        self.timeout = timeout

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        started = time.monotonic()
        try:
            async with self._http.session.post(
                url,
                data=body,
                headers={
                    "Content-Type": "application/json",
                    "User-Agent": USER_AGENT,
                    **headers,
                },
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                excerpt = _printable(await response.content.read(EXCERPT_BYTES))
                status = response.status
                location = response.headers.get("Location", "")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            message, permanent = describe_failure(exc, url, self.timeout)
            return AttemptResult(None, message, None, _ms(started), permanent)
        if 200 <= status < 300:
            return AttemptResult(status, None, excerpt, _ms(started))
        if 300 <= status < 400:
            where = f" to {location}" if location else ""
            error = _short(f"answered {status}, a redirect{where}: redirects are not followed")
            return AttemptResult(status, error, excerpt, _ms(started))
        return AttemptResult(status, f"answered {status}", excerpt, _ms(started))

    async def aclose(self) -> None:
        await self._http.aclose()


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
