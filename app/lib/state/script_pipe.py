"""Lua scripts on Redis over one pipelined connection: the hot path's round trips.

Every admission (``admit_windows``, ``reserve``) and settle is one ``EVALSHA``. Sent
through redis-py, each costs about 50 µs of this process's CPU at concurrency (pool
checkout and release, argument encoding, a per-command timeout, the parser), which is
most of what a quota costs a request. ``ScriptPipe`` sends them on one connection of
its own, with no pool and no per-command task: each call writes one pre-packed
command and waits on a future; replies come back in order (Redis answers a
connection's commands in the order sent) and are handed to the waiters from one
``data_received`` callback. About 10 µs a call, and the pipelining means a burst of
admissions is one write and one read for the kernel, not one each.

What it keeps of the redis-py client it comes from (``ScriptPipe.of``): the address
(TCP, TLS or Unix socket), credentials and database. Errors are redis-py's
(``ConnectionError``, ``TimeoutError``, ``ResponseError``), so the callers' outage
handling (``FallbackStateStore``, the quota gate's failClosed) sees no difference.
A client whose connection class it does not know gets ``None`` from ``of``: its
scripts run through redis-py as before.

Failure: a command unanswered for ``timeout`` seconds aborts the connection, failing
every command on it (their replies would be out of order otherwise); a lost
connection fails its waiters at once; the next call connects again. A script the
server does not know (a restart, ``SCRIPT FLUSH``) is loaded and the call retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, Protocol, Self, cast

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.lib.state.resp import Incomplete, RespReply, pack_command, parse_reply

Arg = bytes | str | int
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0


class Script(Protocol):
    """A registered Lua script: a ``PipeScript`` or redis-py's ``AsyncScript``."""

    def __call__(
        self, keys: Sequence[Any] | None = None, args: Sequence[Any] | None = None
    ) -> Awaitable[Any]: ...


class PipeScript:
    """One Lua script run through a ``ScriptPipe``; called like redis-py's
    ``AsyncScript`` (``await script(keys=[...], args=[...])``), same replies (RESP2:
    bytes, int, lists of them)."""

    __slots__ = ("_pipe", "body", "sha")

    def __init__(self, pipe: ScriptPipe, body: str) -> None:
        self._pipe = pipe
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()  # noqa: S324 - Redis names scripts so

    async def __call__(
        self, keys: Sequence[Arg] | None = None, args: Sequence[Arg] | None = None
    ) -> RespReply:
        keys = keys or ()
        command = pack_command((b"EVALSHA", self.sha, len(keys), *keys, *(args or ())))
        try:
            return await self._pipe.send(command)
        except NoScriptError:
            await self._pipe.send(pack_command((b"SCRIPT", b"LOAD", self.body)))
            return await self._pipe.send(command)


class _Endpoint:
    """Where and as whom to connect, read off a redis-py pool's settings."""

    __slots__ = ("db", "host", "password", "path", "port", "ssl_context", "username")

    def __init__(self, kwargs: dict[str, Any], *, unix: bool, tls: bool) -> None:
        self.host: str = kwargs.get("host", "localhost")
        self.port: int = int(kwargs.get("port", 6379))
        self.path: str | None = kwargs.get("path") if unix else None
        self.db = int(kwargs.get("db") or 0)
        self.username: str | None = kwargs.get("username")
        self.password: str | None = kwargs.get("password")
        self.ssl_context = _ssl_context(kwargs) if tls else None

    def handshake(self) -> list[bytes]:
        commands = []
        if self.password is not None:
            auth: tuple[Arg, ...] = (b"AUTH", self.password)
            if self.username:
                auth = (b"AUTH", self.username, self.password)
            commands.append(pack_command(auth))
        if self.db:
            commands.append(pack_command((b"SELECT", self.db)))
        return commands


def _ssl_context(kwargs: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=kwargs.get("ssl_ca_certs"))
    if kwargs.get("ssl_certfile"):
        context.load_cert_chain(kwargs["ssl_certfile"], kwargs.get("ssl_keyfile"))
    reqs = kwargs.get("ssl_cert_reqs", "required")
    if isinstance(reqs, str):
        reqs = {
            "none": ssl.CERT_NONE,
            "optional": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED,
        }[reqs.lower()]
    context.check_hostname = bool(kwargs.get("ssl_check_hostname", True)) and (
        reqs != ssl.CERT_NONE
    )
    context.verify_mode = reqs
    return context


class PipeStats:
    """What a pipe sent, over all its connections: ``commands`` in ``writes`` send(2)
    calls (their ratio is what the coalescing saves)."""

    __slots__ = ("commands", "writes")

    def __init__(self) -> None:
        self.commands = 0
        self.writes = 0


class PipeMetrics(Collector):
    """``/metrics`` of a pipe: how many scripts it sent in how many writes."""

    def __init__(self, stats: PipeStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "arona_redis_script_commands",
            "Scripts sent on the pipelined Redis script connection.",
            value=self._stats.commands,
        )
        yield CounterMetricFamily(
            "arona_redis_script_writes",
            "Writes (send system calls) those scripts took: several scripts of one "
            "event-loop turn share one.",
            value=self._stats.writes,
        )


class _Protocol(asyncio.Protocol):
    """One connection: commands go out in order, replies resolve waiters in order."""

    def __init__(self, timeout: float, stats: PipeStats) -> None:
        self._timeout = timeout
        self._stats = stats
        self._waiters: deque[tuple[asyncio.Future[RespReply], float]] = deque()
        self._outbox: list[bytes] = []
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast("asyncio.Transport", transport)

    def send(self, command: bytes) -> asyncio.Future[RespReply]:
        if self.lost is not None or self._transport is None:
            raise RedisConnectionError("the script connection to Redis is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RespReply] = loop.create_future()
        self._waiters.append((future, loop.time()))
        # Written at the end of this loop turn with the turn's other commands: one
        # send(2) for all of them (a system call costs more here than packing one).
        if not self._outbox:
            loop.call_soon(self._flush)
        self._outbox.append(command)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self._timeout, self._check_overdue)
        return future

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        if self.lost is None and self._transport is not None and outbox:
            self._transport.write(b"".join(outbox))
            self._stats.writes += 1
            self._stats.commands += len(outbox)

    def _check_overdue(self) -> None:
        self._watchdog = None
        if not self._waiters:
            return
        loop = asyncio.get_running_loop()
        waited = loop.time() - self._waiters[0][1]
        if waited >= self._timeout:
            self._fail(RedisTimeoutError(f"Redis did not answer a script in {self._timeout} s"))
            return
        self._watchdog = loop.call_later(self._timeout - waited, self._check_overdue)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        position = 0
        waiters = self._waiters
        try:
            while position < len(buffer):
                reply, position = parse_reply(buffer, position)
                if not waiters:
                    raise RedisConnectionError("Redis sent a reply nobody asked for")
                future, _ = waiters.popleft()
                if future.done():  # its caller was cancelled; the reply is still its
                    continue
                if isinstance(reply, ResponseError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except Incomplete:
            pass
        except Exception as exc:  # a reply this parser cannot read: nothing after it can be
            self._fail(RedisConnectionError(f"unreadable reply from Redis: {exc!r}"))
            return
        self._buffer = buffer[position:]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"the script connection to Redis was lost: {exc!r}"))

    def _fail(self, error: BaseException) -> None:
        if self.lost is None:
            self.lost = error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._outbox.clear()
        while self._waiters:
            future, _ = self._waiters.popleft()
            if not future.done():
                future.set_exception(error)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(RedisConnectionError("the script connection to Redis was closed"))


class ScriptPipe:
    """Pipelined scripts on one connection (see the module doc); ``close`` at the end."""

    def __init__(
        self,
        endpoint: _Endpoint,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._closed = False
        self.stats = PipeStats()

    @classmethod
    def of(cls, client: Redis) -> Self | None:
        """A pipe to where ``client`` connects, as whom it connects, with its
        timeouts; ``None`` for a connection class this does not speak."""
        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kind = pool.connection_class
        if kind is UnixDomainSocketConnection:
            endpoint = _Endpoint(kwargs, unix=True, tls=False)
        elif kind is SSLConnection:
            endpoint = _Endpoint(kwargs, unix=False, tls=True)
        elif kind is Connection:
            endpoint = _Endpoint(kwargs, unix=False, tls=False)
        else:
            return None
        return cls(
            endpoint,
            timeout=float(kwargs.get("socket_timeout") or DEFAULT_TIMEOUT),
            connect_timeout=float(kwargs.get("socket_connect_timeout") or DEFAULT_CONNECT_TIMEOUT),
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def script(self, body: str) -> PipeScript:
        return PipeScript(self, body)

    async def send(self, command: bytes) -> RespReply:
        """Send one packed command and wait for its reply (an error reply raises)."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            protocol = await self._connected()
        return await protocol.send(command)

    async def _connected(self) -> _Protocol:
        if self._closed:
            raise RedisConnectionError("the script pipe is closed")
        # One connection attempt at a time; the calls that arrive meanwhile share it.
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        endpoint = self._endpoint
        try:
            async with asyncio.timeout(self._connect_timeout):
                if endpoint.path is not None:
                    _, protocol = await loop.create_unix_connection(
                        lambda: _Protocol(self._timeout, self.stats), endpoint.path
                    )
                else:
                    _, protocol = await loop.create_connection(
                        lambda: _Protocol(self._timeout, self.stats),
                        endpoint.host,
                        endpoint.port,
                        ssl=endpoint.ssl_context,
                    )
                try:
                    for command in endpoint.handshake():
                        await protocol.send(command)
                except BaseException:
                    protocol.close()
                    raise
        except TimeoutError as exc:
            raise RedisTimeoutError("timed out connecting the script pipe to Redis") from exc
        except OSError as exc:
            raise RedisConnectionError(
                f"could not connect the script pipe to Redis: {exc}"
            ) from exc
        if self._closed:
            protocol.close()
            raise RedisConnectionError("the script pipe is closed")
        self._protocol = protocol
        return protocol

    async def close(self) -> None:
        self._closed = True
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None


class StoreScripts:
    """Where a Redis store registers its scripts: on a ``ScriptPipe`` to the client's
    server when ``ScriptPipe.of`` speaks its connection, else on the client."""

    def __init__(self, client: Redis) -> None:
        self._client = client
        self.pipe = ScriptPipe.of(client)

    def register(self, body: str) -> Script:
        if self.pipe is None:
            return self._client.register_script(body)
        return self.pipe.script(body)

    async def close(self) -> None:
        if self.pipe is not None:
            await self.pipe.close()
