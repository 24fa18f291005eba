"""Engine (CEP) adapter failure paths against a misbehaving engine: refused handshakes,
dropped sockets, malformed frames, strays, silence, JSON-RPC errors, closing."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from app.fakes import FakeOllama, serve_asgi
from app.fakes.engine_echo import EchoEngine, UpgradeRefusal
from app.fakes.engine_misbehaving import MisbehavingEngine, Misbehaviour
from app.lib.ports import free_port
from app.routing.backends.base import ChatStream
from app.routing.errors import StreamInterruptedError, UpstreamError
from tests.support.upstreams import (
    EngineFactory,
    chat_call,
    collect,
    eventually,
    sse_events,
    streamed_text,
)

MODEL = "echo-1"


def ask(text: str, *, stream: bool = False):
    return chat_call(MODEL, stream=stream, messages=[{"role": "user", "content": text}])


def reply_of(content: bytes) -> str:
    text: str = msgspec.json.decode(content)["choices"][0]["message"]["content"]
    return text


def not_a_stream_error(exc: UpstreamError) -> bool:
    return not isinstance(exc, StreamInterruptedError)


async def drain(stream: ChatStream) -> tuple[bytes, BaseException | None]:
    received: list[bytes] = []
    try:
        async for chunk in stream:
            received.append(chunk)
    except Exception as exc:
        return b"".join(received), exc
    return b"".join(received), None


# -- handshake and dialling ----------------------------------------------------------------


async def test_a_refused_handshake_makes_the_backend_unhealthy_until_it_is_accepted(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.mode = Misbehaviour.BAD_HANDSHAKE
    adapter = engine_backend(engine.url)
    result = await adapter.probe()
    assert not result.healthy
    assert result.reason == "engine refused the handshake: engine under maintenance"
    for call in (adapter.chat(ask("hi")), adapter.chat_stream(ask("hi", stream=True))):
        with pytest.raises(UpstreamError) as caught:
            await call
        assert "engine under maintenance" in caught.value.message
        assert caught.value.retryable
        assert not_a_stream_error(caught.value)
    assert engine.stats.refused_handshakes == 3
    assert adapter.in_flight == 0
    engine.mode = Misbehaviour.NONE
    assert (await adapter.probe()).healthy
    assert engine.stats.handshakes == 1


async def test_an_unreachable_engine(engine_backend: EngineFactory) -> None:
    result = await engine_backend(f"ws://127.0.0.1:{free_port()}").probe()
    assert not result.healthy
    assert result.reason == "upstream unreachable: connection refused"


async def test_a_server_that_is_not_an_engine(engine_backend: EngineFactory) -> None:
    async with serve_asgi(FakeOllama("not-an-engine")) as url:
        adapter = engine_backend(url.replace("http://", "ws://"))
        result = await adapter.probe()
        assert not result.healthy
        assert result.reason.startswith("upstream unreachable: websocket upgrade refused: status")
        with pytest.raises(UpstreamError):
            await adapter.chat(ask("hi"))


async def test_a_throttled_upgrade_carries_its_status_and_retry_after(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    """A 429 to the WebSocket upgrade is throttling, told like an HTTP upstream's: the
    error keeps the status and the ``Retry-After`` for the client."""
    echo_engine.upgrade_refusal = UpgradeRefusal(429, "13")
    adapter = engine_backend(echo_engine.url)
    for call in (adapter.chat(ask("hi")), adapter.chat_stream(ask("hi", stream=True))):
        with pytest.raises(UpstreamError) as caught:
            await call
        assert caught.value.upstream_status == 429
        assert caught.value.retryable
        assert caught.value.headers == {"Retry-After": "13"}
        assert caught.value.message == "upstream 429: websocket upgrade refused"
    echo_engine.upgrade_refusal = UpgradeRefusal(503, "13")
    with pytest.raises(UpstreamError) as other:
        await adapter.chat(ask("hi"))
    assert other.value.upstream_status is None  # any other refusal: a transport failure
    assert other.value.headers == {}
    echo_engine.upgrade_refusal = None
    assert (await adapter.probe()).healthy


async def test_a_handshake_that_never_comes_times_out(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    misbehaving_engine.mode = Misbehaviour.SILENT
    adapter = engine_backend(misbehaving_engine.url, connect_timeout=0.3)
    result = await adapter.probe()
    assert not result.healthy
    assert result.reason == "upstream unreachable: no handshake within 0.3s"
    misbehaving_engine.mode = Misbehaviour.NONE
    assert (await adapter.probe()).healthy
    assert misbehaving_engine.stats.connections == 2


# -- the connection dropping under its callers ------------------------------------------


async def test_a_socket_dropped_mid_stream_fails_every_waiter_and_the_next_call_reconnects(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.chunks, engine.chunk_delay = 40, 0.02
    engine.mode, engine.drop_after = Misbehaviour.DROP_MID_STREAM, 10_000
    adapter = engine_backend(engine.url, request_timeout=30.0)
    reading = await adapter.chat_stream(ask("the one being read", stream=True))
    first = await anext(aiter(reading))
    assert b'"role":"assistant"' in first
    idle = await adapter.chat_stream(ask("the one nobody reads yet", stream=True))
    engine.chat_delay = 30.0
    pending = asyncio.create_task(adapter.chat(ask("a call waiting for its answer")))
    await eventually(lambda: len(engine.calls("Engine.Chat")) == 1)
    engine.drop_after = 0  # the next chunk of either stream cuts the socket

    with pytest.raises(StreamInterruptedError) as read_error:
        async for _ in reading:
            pass
    assert "upstream stream interrupted: connection" in read_error.value.message
    received, idle_error = await drain(idle)
    assert isinstance(idle_error, StreamInterruptedError)
    assert streamed_text(sse_events(received)) != ""  # what arrived before the cut came first
    with pytest.raises(UpstreamError) as pending_error:
        await pending
    assert not_a_stream_error(pending_error.value)
    assert pending_error.value.retryable
    assert engine.dropped == 1
    assert adapter.in_flight == 0

    engine.mode, engine.chat_delay = Misbehaviour.NONE, 0.0
    assert reply_of((await adapter.chat(ask("back again"))).content) == "back again"
    assert (engine.stats.connections, engine.stats.handshakes) == (2, 2)


async def test_a_drop_before_the_first_chunk_fails_the_stream_before_any_byte(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    misbehaving_engine.mode, misbehaving_engine.drop_after = Misbehaviour.DROP_MID_STREAM, 0
    stream = await engine_backend(misbehaving_engine.url).chat_stream(ask("x", stream=True))
    received, error = await drain(stream)
    assert received == b""  # nothing reached the client: the router may retry elsewhere
    assert isinstance(error, StreamInterruptedError)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        (Misbehaviour.NOT_JSON, "malformed frame from the engine (not JSON)"),
        (Misbehaviour.NOT_JSONRPC, "malformed frame from the engine (not JSON-RPC)"),
        (
            Misbehaviour.UNKNOWN_RESPONSE_ID,
            "engine answered request id 987654, which was never sent",
        ),
    ],
)
async def test_a_malformed_answer_drops_the_connection_for_every_waiter(
    mode: Misbehaviour,
    reason: str,
    misbehaving_engine: MisbehavingEngine,
    engine_backend: EngineFactory,
) -> None:
    engine = misbehaving_engine
    engine.chunks, engine.chunk_delay = 20, 0.5
    adapter = engine_backend(engine.url)
    stream = await adapter.chat_stream(ask("a slow stream in flight", stream=True))
    engine.mode = mode
    with pytest.raises(UpstreamError) as caught:
        await adapter.chat(ask("this answer comes back broken"))
    assert caught.value.message == f"upstream unreachable: {reason}"
    _, error = await drain(stream)
    assert isinstance(error, StreamInterruptedError)
    assert error.message == f"upstream stream interrupted: {reason}"
    assert adapter.connection is None
    engine.mode = Misbehaviour.NONE
    assert reply_of((await adapter.chat(ask("fresh"))).content) == "fresh"
    assert engine.stats.handshakes == 2


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("}{", "malformed frame from the engine (not JSON)"),
        ("[1, 2, 3]", "malformed frame from the engine (not JSON-RPC)"),
        (
            '{"jsonrpc": "2.0", "method": "Engine.ChatChunk", "params": {"token": "x"}}',
            "malformed Engine.ChatChunk from the engine",
        ),
    ],
)
async def test_unsolicited_garbage_drops_the_connection(
    frame: str, reason: str, misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.chat_delay = 30.0
    adapter = engine_backend(engine.url)
    pending = asyncio.create_task(adapter.chat(ask("waiting")))
    await eventually(lambda: len(engine.calls("Engine.Chat")) == 1)
    await engine.broadcast(frame)
    with pytest.raises(UpstreamError) as caught:
        await pending
    assert caught.value.message == f"upstream unreachable: {reason}"


async def test_chunks_for_unknown_streams_are_ignored(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.mode, engine.chunks = Misbehaviour.STRAY_CHUNKS, 5
    adapter = engine_backend(engine.url)
    stream = await adapter.chat_stream(ask("only my own words", stream=True))
    events = sse_events(await collect(stream))
    assert streamed_text(events) == "only my own words"
    assert events[-1] == "[DONE]"
    assert len(engine.stray_ids) == 10
    assert reply_of((await adapter.chat(ask("still fine"))).content) == "still fine"
    assert engine.stats.connections == 1


async def test_engine_requests_to_arona_are_answered_method_not_found(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    adapter = engine_backend(misbehaving_engine.url)
    assert (await adapter.probe()).healthy
    await misbehaving_engine.broadcast('{"jsonrpc": "2.0", "id": "e-1", "method": "Arona.Ping"}')
    await misbehaving_engine.broadcast('{"jsonrpc": "2.0", "method": "Engine.Status"}')
    await eventually(lambda: bool(misbehaving_engine.responses))
    (response,) = misbehaving_engine.responses
    assert response["id"] == "e-1"
    assert response["error"]["code"] == -32601
    assert (await adapter.probe()).healthy
    assert misbehaving_engine.stats.connections == 1


# -- timeouts ------------------------------------------------------------------------------


async def test_a_late_answer_is_ignored_and_the_connection_kept(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    adapter = engine_backend(engine.url, request_timeout=0.1)
    engine.chat_delay = 0.4
    with pytest.raises(UpstreamError) as caught:
        await adapter.chat(ask("too slow"))
    assert caught.value.message == "upstream unreachable: no answer to Engine.Chat within 0.1s"
    assert caught.value.retryable
    # Same delay, asked later: the first call's late answer arrives before this one's.
    adapter.request_timeout = 30.0
    assert reply_of((await adapter.chat(ask("patient"))).content) == "patient"
    assert engine.stats.connections == 1


async def test_a_silent_engine_fails_probes_within_the_probe_timeout(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    adapter = engine_backend(misbehaving_engine.url, probe_timeout=0.2)
    assert (await adapter.probe()).healthy
    misbehaving_engine.mode = Misbehaviour.SILENT
    result = await adapter.probe()
    assert not result.healthy
    assert result.reason == "upstream unreachable: no answer to Engine.Models within 0.2s"


async def test_a_stream_that_goes_quiet_is_cut_and_cancelled(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.chunks, engine.chunk_delay = 3, 30.0
    adapter = engine_backend(engine.url, idle_timeout=0.2)
    stream = await adapter.chat_stream(ask("then silence", stream=True))
    received, error = await drain(stream)
    assert b'"role":"assistant"' in received
    assert isinstance(error, StreamInterruptedError)
    assert error.message == "upstream stream interrupted: no chunk within 0.2s"
    stream_id = engine.calls("Engine.ChatStart")[-1].params["stream_id"]
    await eventually(lambda: stream_id in engine.cancelled)
    assert adapter.in_flight == 0
    engine.chunk_delay = 0.0
    assert reply_of((await adapter.chat(ask("next"))).content) == "next"
    assert engine.stats.connections == 1


async def test_a_reader_too_slow_for_its_buffer_is_cut(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.chunks = 12
    adapter = engine_backend(engine.url, stream_buffer=3)
    stream = await adapter.chat_stream(ask("far more chunks than the buffer holds", stream=True))
    stream_id = engine.calls("Engine.ChatStart")[-1].params["stream_id"]
    await eventually(lambda: engine.stats.completed_streams == 1)  # all sent, none read
    await eventually(lambda: len(engine.calls("Engine.ChatCancel")) == 1)
    assert engine.calls("Engine.ChatCancel")[0].params == {"stream_id": stream_id}
    received, error = await drain(stream)
    assert streamed_text(sse_events(received)) == "far more chunks than the buffer holds"[:9]
    assert isinstance(error, StreamInterruptedError)
    assert "client reading too slowly (3 chunks waiting)" in error.message
    assert reply_of((await adapter.chat(ask("others unaffected"))).content) == "others unaffected"


# -- JSON-RPC errors and refusals ---------------------------------------------------------


@pytest.mark.parametrize(("code", "retryable"), [(-32602, False), (-32603, True), (-32001, True)])
async def test_json_rpc_errors_carry_the_engine_message(
    code: int,
    retryable: bool,
    misbehaving_engine: MisbehavingEngine,
    engine_backend: EngineFactory,
) -> None:
    engine = misbehaving_engine
    adapter = engine_backend(engine.url)
    assert (await adapter.probe()).healthy
    engine.mode, engine.rpc_error = Misbehaviour.RPC_ERROR, (code, "the engine says no")
    for call in (adapter.chat(ask("hi")), adapter.chat_stream(ask("hi", stream=True))):
        with pytest.raises(UpstreamError) as caught:
            await call
        assert caught.value.message == f"engine error {code}: the engine says no"
        assert caught.value.retryable is retryable
        assert not_a_stream_error(caught.value)
    result = await adapter.probe()
    assert (result.healthy, result.reason) == (False, f"engine error {code}: the engine says no")
    assert engine.stats.connections == 1  # an error answer is not a broken connection
    assert adapter.in_flight == 0


async def test_a_refused_stream_start(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    misbehaving_engine.mode = Misbehaviour.REFUSE_STREAM
    adapter = engine_backend(misbehaving_engine.url)
    with pytest.raises(UpstreamError) as caught:
        await adapter.chat_stream(ask("hi", stream=True))
    assert caught.value.message == "engine refused the stream: too busy to stream"
    assert caught.value.retryable
    assert adapter.in_flight == 0
    conn = adapter.connection
    assert conn is not None
    assert conn._streams == {}


# -- closing ----------------------------------------------------------------------------------


async def test_a_graceful_close_lets_a_running_stream_finish_and_refuses_new_calls(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.chunks, engine.chunk_delay = 8, 0.03
    adapter = engine_backend(engine.url, drain_timeout=30.0)
    stream = await adapter.chat_stream(ask("finish what you started", stream=True))
    first = await anext(aiter(stream))
    closing = asyncio.create_task(adapter.aclose())
    await eventually(lambda: adapter.closing)
    assert adapter.in_flight == 1
    assert not closing.done()
    with pytest.raises(UpstreamError) as refused:
        await adapter.chat(ask("too late"))
    assert refused.value.message == "engine backend is closing"
    assert refused.value.retryable
    assert (await adapter.probe()).healthy is False
    rest, error = await drain(stream)
    assert error is None
    events = sse_events(first + rest)
    assert streamed_text(events) == "finish what you started"
    assert events[-1] == "[DONE]"
    await closing
    assert adapter.connection is None
    await eventually(lambda: engine.stats.open_connections == 0)
    assert engine.stats.completed_streams == 1
    assert len(engine.calls("Engine.Chat")) == 0


async def test_a_close_stops_waiting_after_the_drain_timeout(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    engine = misbehaving_engine
    engine.chunks, engine.chunk_delay = 4, 30.0
    adapter = engine_backend(engine.url, drain_timeout=0.2)
    stream = await adapter.chat_stream(ask("never finishes", stream=True))
    await adapter.aclose()
    _, error = await drain(stream)
    assert isinstance(error, StreamInterruptedError)
    assert error.message == "upstream stream interrupted: closed by arona"
    assert adapter.in_flight == 0
    with pytest.raises(UpstreamError):
        await adapter.chat(ask("closed"))
    await eventually(lambda: engine.stats.open_connections == 0)


async def test_a_close_gives_up_on_a_dial_that_hangs(
    misbehaving_engine: MisbehavingEngine, engine_backend: EngineFactory
) -> None:
    misbehaving_engine.mode = Misbehaviour.SILENT  # the handshake is never answered
    adapter = engine_backend(misbehaving_engine.url, connect_timeout=30.0, drain_timeout=0.1)
    waiting = asyncio.create_task(adapter.chat(ask("hello?")))
    await eventually(lambda: len(misbehaving_engine.handshakes) == 1)
    await adapter.aclose()
    with pytest.raises(UpstreamError) as caught:
        await waiting
    assert caught.value.message == "engine backend is closed"
    assert adapter.in_flight == 0
    await eventually(lambda: misbehaving_engine.stats.open_connections == 0)
