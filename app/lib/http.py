"""The one outbound HTTP client pool of a process, on ``aiohttp``.

Upstream calls share a single ``aiohttp.ClientSession`` so connections are pooled and
reused across requests. The read timeout is per read (an idle stream is cut after
``READ_TIMEOUT_SECONDS`` of silence, a long but lively one is not); non-streaming
calls additionally get an overall deadline the adapters enforce themselves.

aiohttp is used directly, without an ``httpx`` layer on top: on the relay's hot path
httpx's request/response machinery cost as much CPU as the engine underneath it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from multidict import CIMultiDict, CIMultiDictProxy

from app.lib.memory import HeapTrimmer
from app.lib.settings import Settings
from app.lib.ssrf import GuardedResolver, SsrfPolicy, guarded_socket_factory

CONNECT_TIMEOUT_SECONDS = 10.0
"""Getting a connection: a free pooled one, or a new one established."""
READ_TIMEOUT_SECONDS = 120.0
"""Silence allowed between two reads of an answer."""

MAX_CONNECTIONS = 10_000
"""Upstream connections open at once, all backends together. Each open stream holds
one, so this bounds concurrent streams per process; it is a safety net against
descriptor exhaustion, not a throttle (quotas and breakers do that)."""
KEEPALIVE_EXPIRY_SECONDS = 30.0

NON_STREAM_DEADLINE_SECONDS = 600.0
"""Overall deadline of a non-streaming upstream call (send + full body)."""

PROBE_TIMEOUT_SECONDS = 2.0
"""Overall deadline of a health probe."""

STREAM_IDLE_TIMEOUT_SECONDS = 60.0
"""Silence allowed between two chunks of a stream once its first chunk arrived."""

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_EVENT_BYTES = 1024 * 1024
MAX_LISTING_BYTES = 4 * 1024 * 1024
MAX_ERROR_BYTES = 4096


@dataclass(frozen=True, slots=True)
class UpstreamLimits:
    """How much of an upstream's answer is ever read, and how long it may take.

    Nothing from an upstream is read without a bound: a reply past its limit is cut,
    its connection closed (so the memory and the socket come back at once) and the
    call fails as a bad gateway. Set from ``ARONA_UPSTREAM_*`` (docs/deployment.md).
    """

    max_body_bytes: int = MAX_BODY_BYTES
    """A whole (non-streamed) answer: a chat completion, an embeddings list."""
    max_event_bytes: int = MAX_EVENT_BYTES
    """One line of a stream: an SSE line or event, an NDJSON line."""
    max_listing_bytes: int = MAX_LISTING_BYTES
    """A model listing, a health probe's answer, a Prometheus metrics scrape."""
    max_error_bytes: int = MAX_ERROR_BYTES
    """The part of an error body kept for the error message (the rest is not read)."""
    deadline_seconds: float = NON_STREAM_DEADLINE_SECONDS
    """Overall deadline of a non-streamed call: send, wait, read the whole body."""
    stream_idle_seconds: float = STREAM_IDLE_TIMEOUT_SECONDS
    """Silence allowed between two chunks of a stream that has started; the wait for
    the headers and the first chunk is the read timeout (a long prefill is normal)."""

    @classmethod
    def of(cls, settings: Settings) -> UpstreamLimits:
        return cls(
            max_body_bytes=settings.upstream_max_body_bytes,
            max_event_bytes=settings.upstream_max_event_bytes,
            max_listing_bytes=settings.upstream_max_listing_bytes,
            max_error_bytes=settings.upstream_max_error_bytes,
            deadline_seconds=settings.upstream_timeout_seconds,
            stream_idle_seconds=settings.upstream_stream_idle_timeout_seconds,
        )


USER_AGENT = "arona"

Headers = CIMultiDictProxy[str]
"""Request headers built once (per adapter), in the form aiohttp uses without copying."""


def frozen_headers(headers: Mapping[str, str]) -> Headers:
    """``headers`` as a read-only case-insensitive multidict, to pass on every call."""
    return CIMultiDictProxy(CIMultiDict(headers))


class UpstreamHttp:
    """The process-wide upstream client: settings now, an aiohttp session on first use.

    Resources are built outside any event loop, and an aiohttp session belongs to the
    loop it is created in, so the session is opened lazily by the first call (in the
    app's loop) and closed by ``aclose()`` at shutdown. Calls go through ``session``
    with ``allow_redirects=False``: upstream URLs are registered explicitly, and a
    redirect must not silently send prompts (and API keys) somewhere else. Ambient
    proxy variables and netrc are ignored for the same reason, and cookies are never
    kept.
    """

    __slots__ = (
        "_closed",
        "_keepalive_timeout",
        "_max_connections",
        "_session",
        "_ssl",
        "limits",
        "timeout",
        "trimmer",
    )

    def __init__(
        self,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        read_timeout: float = READ_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        keepalive_timeout: float = KEEPALIVE_EXPIRY_SECONDS,
        limits: UpstreamLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.limits = limits or UpstreamLimits()
        """The read bounds every adapter using this pool applies."""
        self.trimmer = HeapTrimmer()
        """Asked after every large read, so its memory goes back to the system."""
        self.timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect_timeout,
            sock_connect=connect_timeout,
            sock_read=read_timeout,
        )
        """The session's default timeouts (no overall one: streams may run for long)."""
        self._max_connections = max_connections
        self._keepalive_timeout = keepalive_timeout
        # None: the default verification against the system's trust store.
        self._ssl: ssl.SSLContext | bool = True if ssl_context is None else ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled session, opened on first use; call it from the app's event loop."""
        session = self._session
        if session is None:
            session = self._session = self._open()
        return session

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the upstream HTTP client is closed")
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            limit_per_host=0,
            keepalive_timeout=self._keepalive_timeout,
            ssl=self._ssl,
            **self._connector_options(),
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self.timeout,
            headers={"User-Agent": USER_AGENT},
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=True,  # answers are relayed decoded
        )

    def _connector_options(self) -> dict[str, Any]:
        """Extra ``TCPConnector`` arguments (a subclass's resolver, socket factory)."""
        return {}

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Close the pool and its connections; the client cannot be used afterwards."""
        self._closed = True
        self.trimmer.cancel()
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def build_http_client(
    *,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    limits: UpstreamLimits | None = None,
) -> UpstreamHttp:
    """The process-wide pool; the timeouts override the defaults (tests use short ones)."""
    return UpstreamHttp(connect_timeout=connect_timeout, read_timeout=read_timeout, limits=limits)


class GuardedUpstreamHttp(UpstreamHttp):
    """An ``UpstreamHttp`` whose every connection passes the SSRF guard.

    Its connector resolves names through ``GuardedResolver`` (refused addresses are
    dropped from each lookup, so DNS rebinding finds nothing to connect to) and opens
    sockets through ``guarded_socket_factory`` (a literal IP, which aiohttp does not
    resolve, is checked there). A refusal surfaces as ``aiohttp.ClientConnectorError``
    caused by ``app.lib.ssrf.SsrfRefusedError`` (``ssrf.refusal_of(exc)`` finds it).
    Calls must still pass ``allow_redirects=False``, as every upstream call does.
    """

    __slots__ = ("_resolver", "_resolver_factory", "policy")

    def __init__(
        self,
        policy: SsrfPolicy,
        *,
        resolver_factory: Callable[[], AbstractResolver] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.policy = policy
        self._resolver_factory = resolver_factory
        self._resolver: AbstractResolver | None = None

    def _connector_options(self) -> dict[str, Any]:
        # Built with the session, in the app's event loop (a resolver binds to it).
        factory = self._resolver_factory or aiohttp.DefaultResolver
        self._resolver = GuardedResolver(self.policy, factory())
        return {"resolver": self._resolver, "socket_factory": guarded_socket_factory(self.policy)}

    async def aclose(self) -> None:
        await super().aclose()
        # A connector does not close a resolver it was handed.
        resolver, self._resolver = self._resolver, None
        if resolver is not None:
            await resolver.close()


def build_guarded_http_client(
    policy: SsrfPolicy,
    *,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    resolver_factory: Callable[[], AbstractResolver] | None = None,
    limits: UpstreamLimits | None = None,
    max_connections: int = MAX_CONNECTIONS,
    ssl_context: ssl.SSLContext | None = None,
) -> GuardedUpstreamHttp:
    """The pool for upstreams chosen by project owners (custom LLMs, webhooks), separate
    from the platform's own: ``policy`` decides which addresses it may connect to;
    ``resolver_factory`` replaces the system resolver underneath the guard (tests);
    ``ssl_context`` replaces the default certificate verification (extra CAs)."""
    return GuardedUpstreamHttp(
        policy,
        resolver_factory=resolver_factory,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        limits=limits,
        max_connections=max_connections,
        ssl_context=ssl_context,
    )
