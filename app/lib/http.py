"""The one outbound HTTP client pool of a process.

Upstream calls share a single ``httpx.AsyncClient`` so connections are pooled and
reused across requests. The read timeout is per read (an idle stream is cut after
``READ_TIMEOUT_SECONDS`` of silence, a long but lively one is not); non-streaming
calls additionally get an overall deadline the adapters enforce themselves.
"""

from __future__ import annotations

import httpx

from app.lib.aiohttp_transport import AiohttpTransport

CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 120.0
WRITE_TIMEOUT_SECONDS = 60.0
POOL_TIMEOUT_SECONDS = 10.0

MAX_CONNECTIONS = 1000
MAX_KEEPALIVE_CONNECTIONS = 200
KEEPALIVE_EXPIRY_SECONDS = 30.0

NON_STREAM_DEADLINE_SECONDS = 600.0
"""Overall deadline of a non-streaming upstream call (send + full body)."""

PROBE_TIMEOUT_SECONDS = 2.0
"""Overall deadline of a health probe."""

USER_AGENT = "arona"

DEFAULT_TIMEOUT = httpx.Timeout(
    connect=CONNECT_TIMEOUT_SECONDS,
    read=READ_TIMEOUT_SECONDS,
    write=WRITE_TIMEOUT_SECONDS,
    pool=POOL_TIMEOUT_SECONDS,
)


def build_http_client(*, timeout: httpx.Timeout | None = None) -> httpx.AsyncClient:
    """The process-wide pool; ``timeout`` overrides the defaults (tests use short ones)."""
    return httpx.AsyncClient(
        transport=AiohttpTransport(
            max_connections=MAX_CONNECTIONS, keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS
        ),
        timeout=timeout or DEFAULT_TIMEOUT,
        # Upstream URLs are registered explicitly: a redirect or an ambient proxy
        # variable must not silently send prompts (and API keys) somewhere else.
        follow_redirects=False,
        trust_env=False,
        headers={"User-Agent": USER_AGENT},
    )
