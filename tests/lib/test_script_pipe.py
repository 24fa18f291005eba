"""``ScriptPipe``: the hot path's scripts on one pipelined connection, against real
Redis servers (the shared one, and servers of the test's own for passwords, Unix
sockets, TLS and outages), plus a loopback server that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.lib.redis_client import build_redis
from app.lib.state.resp import Incomplete, pack_command, parse_reply
from app.lib.state.script_pipe import ScriptPipe, StoreScripts
from tests.support.redis_instance import RedisInstance
from tests.support.settings import REDIS_URL
from tests.support.webhooks import make_tls

ECHO = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]), {ARGV[3]}, false}"
FAILS = "return redis.error_reply('boom: ' .. ARGV[1])"
SET_AND_GET = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])"


def _pipe(client: Redis) -> ScriptPipe:
    pipe = ScriptPipe.of(client)
    assert pipe is not None
    return pipe


@pytest.fixture
async def client() -> AsyncIterator[Redis]:
    redis = build_redis(REDIS_URL)
    yield redis
    await redis.aclose()


@pytest.fixture
async def pipe(client: Redis) -> AsyncIterator[ScriptPipe]:
    pipe = _pipe(client)
    yield pipe
    await pipe.close()


# -- the wire format -------------------------------------------------------------


def test_pack_command_frames_every_argument_as_a_bulk_string() -> None:
    assert pack_command([b"GET", "clé", 42]) == (
        b"*3\r\n$3\r\nGET\r\n$4\r\ncl\xc3\xa9\r\n$2\r\n42\r\n"
    )
    with pytest.raises(TypeError, match="float"):
        pack_command([b"SET", 1.5])  # type: ignore[list-item]


def test_parse_reply_reads_every_resp2_type() -> None:
    wire = b"*5\r\n:-7\r\n$3\r\nabc\r\n$-1\r\n*1\r\n+OK\r\n*-1\r\n-ERR no\r\n"
    reply, position = parse_reply(wire, 0)
    assert reply == [-7, b"abc", None, [b"OK"], None]
    error, end = parse_reply(wire, position)
    assert isinstance(error, ResponseError)
    assert str(error) == "ERR no"
    assert end == len(wire)


def test_parse_reply_waits_for_a_reply_cut_anywhere() -> None:
    wire = b"*2\r\n$5\r\nhello\r\n:12\r\n"
    for cut in range(len(wire)):
        with pytest.raises(Incomplete):
            parse_reply(wire[:cut], 0)
    assert parse_reply(wire, 0) == ([b"hello", 12], len(wire))


def test_parse_reply_refuses_what_is_not_resp2() -> None:
    with pytest.raises(ValueError, match="RESP2"):
        parse_reply(b"%1\r\n", 0)


# -- against the shared Redis ------------------------------------------------------


async def test_replies_match_redis_py(client: Redis, pipe: ScriptPipe) -> None:
    key = f"pipe-test:{uuid.uuid4().hex}"
    through_pipe = await pipe.script(ECHO)(keys=[key], args=["a", 5, "b"])
    through_client = await client.register_script(ECHO)(keys=[key], args=["a", 5, "b"])
    assert through_pipe == through_client == [key.encode(), b"a", 5, [b"b"], None]


async def test_an_error_reply_raises_and_the_pipe_goes_on(pipe: ScriptPipe) -> None:
    with pytest.raises(ResponseError, match="boom: x"):
        await pipe.script(FAILS)(args=["x"])
    assert await pipe.script(ECHO)(keys=["k"], args=["a", 1, "b"]) == [
        b"k",
        b"a",
        1,
        [b"b"],
        None,
    ]


async def test_a_script_the_server_forgot_is_loaded_again(client: Redis, pipe: ScriptPipe) -> None:
    script = pipe.script("return 'loaded ' .. ARGV[1]")
    assert await script(args=["once"]) == b"loaded once"
    await client.script_flush()
    assert await script(args=["again"]) == b"loaded again"


async def test_concurrent_calls_each_get_their_own_reply(pipe: ScriptPipe) -> None:
    script = pipe.script("return ARGV[1]")
    replies = await asyncio.gather(*(script(args=[str(i)]) for i in range(2000)))
    assert replies == [str(i).encode() for i in range(2000)]


async def test_a_cancelled_call_leaves_the_others_their_replies(pipe: ScriptPipe) -> None:
    slow = pipe.script("local t = redis.call('TIME'); return ARGV[1]")
    calls = [asyncio.ensure_future(slow(args=[str(i)])) for i in range(50)]
    calls[10].cancel()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[10], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i != 10] == [
        str(i).encode() for i in range(50) if i != 10
    ]


async def test_a_killed_connection_fails_its_calls_and_the_next_call_reconnects(
    tmp_path: Path,
) -> None:
    redis = RedisInstance(tmp_path)  # of its own: killing clients of the shared one would
    redis.start()  # cut other tests' connections
    client = build_redis(redis.url)
    pipe = _pipe(client)
    script = pipe.script("return ARGV[1]")
    try:
        assert await script(args=["before"]) == b"before"
        assert await client.client_kill_filter(_type="normal", skipme=True) == 1
        # The kill may reach the pipe before or after this call is written: either it
        # fails as a lost connection, or it is the first call of a new connection.
        with contextlib.suppress(RedisConnectionError):
            assert await script(args=["during"]) == b"during"
        assert await script(args=["after"]) == b"after"
    finally:
        await pipe.close()
        await client.aclose()
        redis.kill()


async def test_a_closed_pipe_refuses_calls(client: Redis) -> None:
    pipe = _pipe(client)
    await pipe.script("return 1")()
    await pipe.close()
    with pytest.raises(RedisConnectionError, match="closed"):
        await pipe.script("return 1")()


def test_store_scripts_fall_back_to_redis_py_for_unknown_connections() -> None:
    class Custom(Connection):
        pass

    client = Redis(connection_pool=ConnectionPool(connection_class=Custom))
    assert ScriptPipe.of(client) is None
    assert type(StoreScripts(client).register("return 1")).__name__ == "AsyncScript"


# -- servers of the test's own ----------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


async def test_an_unanswered_call_times_out_and_fails_the_calls_behind_it(
    silent_port: int,
) -> None:
    client = build_redis(f"redis://127.0.0.1:{silent_port}/0", socket_timeout=0.3)
    pipe = _pipe(client)
    script = pipe.script("return 1")
    results = await asyncio.gather(*(script() for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, RedisTimeoutError) for r in results), results
    await pipe.close()
    await client.aclose()


async def test_a_server_that_is_down_is_a_connection_error(tmp_path: Path) -> None:
    redis = RedisInstance(tmp_path)
    redis.start()
    client = build_redis(redis.url)
    pipe = _pipe(client)
    script = pipe.script("return ARGV[1]")
    try:
        assert await script(args=["up"]) == b"up"
        redis.kill()
        with pytest.raises(RedisConnectionError):
            await script(args=["down"])
        with pytest.raises(RedisConnectionError):
            await script(args=["still down"])
        redis.start()
        assert await script(args=["back"]) == b"back"
    finally:
        await pipe.close()
        await client.aclose()
        redis.kill()


async def test_password_user_and_database_come_from_the_client(tmp_path: Path) -> None:
    redis = RedisInstance(tmp_path, extra_args=["--requirepass", "s3cret"])
    redis.start()
    try:
        base = f"127.0.0.1:{redis.port}"
        admin = build_redis(f"redis://:s3cret@{base}/0")
        await admin.acl_setuser(
            "app",
            enabled=True,
            passwords=["+apppass"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
        )
        for url in (f"redis://:s3cret@{base}/3", f"redis://app:apppass@{base}/3"):
            client = build_redis(url)
            pipe = _pipe(client)
            assert await pipe.script(SET_AND_GET)(keys=["where"], args=[url]) == url.encode()
            assert await client.get("where") == url.encode()  # database 3, as the client
            await pipe.close()
            await client.aclose()
        wrong = build_redis(f"redis://:nope@{base}/0")
        pipe = _pipe(wrong)
        with pytest.raises(ResponseError):
            await pipe.script("return 1")()
        await pipe.close()
        await wrong.aclose()
        await admin.aclose()
    finally:
        redis.kill()


async def test_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"
    redis = RedisInstance(tmp_path, extra_args=["--unixsocket", str(path)])
    redis.start()
    try:
        client = Redis.from_url(f"unix://{path}?db=2")
        pipe = _pipe(client)
        assert await pipe.script(SET_AND_GET)(keys=["k"], args=["over unix"]) == b"over unix"
        assert await client.get("k") == b"over unix"
        await pipe.close()
        await client.aclose()
    finally:
        redis.kill()


async def test_tls_checks_the_servers_certificate(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    tls_port = RedisInstance(tmp_path).port
    redis = RedisInstance(
        tmp_path,
        extra_args=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(tls.cert_file),
            "--tls-key-file",
            str(tls.key_file),
            "--tls-ca-cert-file",
            str(tls.ca_file),
            "--tls-auth-clients",
            "no",
        ],
    )
    redis.start()
    try:
        url = f"rediss://localhost:{tls_port}/0"
        trusted = Redis.from_url(f"{url}?ssl_ca_certs={tls.ca_file}")
        pipe = _pipe(trusted)
        assert await pipe.script("return ARGV[1]")(args=["over tls"]) == b"over tls"
        await pipe.close()
        await trusted.aclose()

        untrusted = Redis.from_url(url)  # the system's authorities do not know the test's
        pipe = _pipe(untrusted)
        with pytest.raises(RedisConnectionError, match="certificate"):
            await pipe.script("return 1")()
        await pipe.close()
        await untrusted.aclose()
    finally:
        redis.kill()
