"""An ``httpx`` transport that sends through ``aiohttp``.

Measured on the gateway's hot path (see docs/performance.md), httpcore's connection
pool cost about 1.3 ms of CPU per relayed call: it checks every pooled connection's
socket for expiry on each request. aiohttp's C-accelerated client does the same work
for a fraction of that. Adapters keep the ``httpx`` API (requests, responses, errors);
only the engine underneath changes, and its failures are mapped to ``httpx``
exceptions so callers see one error vocabulary.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import aiohttp
import httpx

CHUNK_BYTES = 64 * 1024


def _timeout(request: httpx.Request) -> aiohttp.ClientTimeout:
    timeout = request.extensions.get("timeout", {})
    return aiohttp.ClientTimeout(
        total=None,
        connect=timeout.get("pool"),
        sock_connect=timeout.get("connect"),
        sock_read=timeout.get("read"),
    )


def _mapped(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The ``httpx`` exception for an aiohttp failure (the original kept as cause)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, aiohttp.SocketTimeoutError | asyncio.TimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message, request=request)
    return httpx.ReadError(message, request=request)


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            # iter_any: whatever arrived, at once; a relayed SSE chunk is not held back
            # waiting to fill a buffer.
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _mapped(exc, self._request) from exc

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()  # fully read: the connection goes back to the pool
        else:
            # Abandoned mid-body: close the connection so the upstream sees the client
            # leave and stops generating, instead of draining it into the pool.
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        *,
        max_connections: int,
        keepalive_expiry: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: an aiohttp session belongs to the running event loop.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                keepalive_timeout=self._keepalive_expiry,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,  # httpx decodes content-encoding itself
                trust_env=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            content: bytes | None = request.content or None
        except httpx.RequestNotRead:
            content = await request.aread() or None
        try:
            response = await self._client().request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=content,
                allow_redirects=False,
                timeout=_timeout(request),
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _mapped(exc, request) from exc
        extensions: dict[str, object] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_ResponseStream(response, request),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
