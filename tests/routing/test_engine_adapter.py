"""Engine (CEP) adapter against the real reference engine: handshake, discovery, chat,
streams, embeddings, and many callers sharing one connection."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

import msgspec
import pytest

import app
from app.fakes.content import count_tokens, fake_vector
from app.fakes.engine_echo import EchoEngine
from app.lib.errors import BadRequestError
from app.routing.backends.engine import EngineBackend
from app.routing.breaker import CircuitBreaker
from app.routing.errors import UpstreamError
from app.routing.registry import BackendState
from app.routing.types import Health, HealthStatus, UpstreamCall, Usage
from tests.support.upstreams import (
    EngineFactory,
    chat_call,
    collect,
    eventually,
    raw_body,
    sse_events,
    streamed_text,
)

MODEL = "echo-1"


def ask(text: str, *, stream: bool = False, include_usage: bool = False, **fields: object):
    call = chat_call(MODEL, stream=stream, include_usage=include_usage, **fields)
    call.body["messages"] = msgspec.Raw(
        msgspec.json.encode(
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        )
    )
    return call


def reply_of(content: bytes) -> str:
    completion = msgspec.json.decode(content)
    text: str = completion["choices"][0]["message"]["content"]
    return text


def sent_messages(engine: EchoEngine, method: str = "Engine.Chat") -> Any:
    return engine.calls(method)[-1].params["messages"]


# -- handshake and discovery ---------------------------------------------------------


async def test_probe_discovers_models_over_one_handshake(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    adapter = engine_backend(echo_engine.url, models=("static-first",))
    result = await adapter.probe()
    assert result.healthy, result.reason
    assert result.models == ("echo-1", "echo-embed")
    # CEP: the registry appends the static ids after the discovered ones.
    state = BackendState(adapter=adapter, breaker=CircuitBreaker())
    state.apply_probe(result, Health(HealthStatus.HEALTHY, "ok", 0.0))
    assert state.models == ("echo-1", "echo-embed", "static-first")
    assert await adapter.probe() == result
    assert (echo_engine.stats.connections, echo_engine.stats.handshakes) == (1, 1)
    assert echo_engine.stats.listings == 2
    (handshake,) = echo_engine.handshakes
    assert handshake["engine"] == {
        "name": "arona",
        "version": app.__version__,
        "language": "python",
    }
    assert handshake["capabilities"]["streaming"] is True
    assert handshake["capabilities"]["protocol_versions"] == [1, 2]
    assert "token" not in handshake
    conn = adapter.connection
    assert conn is not None
    assert conn.protocol_version == 2
    assert conn.capabilities.max_context_length == 8192
    assert adapter.kind == "engine"
    assert adapter.capabilities == frozenset({"chat", "embeddings"})


async def test_the_right_token_is_accepted(engine_backend: EngineFactory) -> None:
    async with EchoEngine(token="open-sesame") as engine:
        adapter = engine_backend(engine.url, api_key="open-sesame")
        assert (await adapter.probe()).healthy
        assert engine.handshakes[0]["token"] == "open-sesame"
        assert reply_of((await adapter.chat(ask("knock knock"))).content) == "knock knock"


@pytest.mark.parametrize("token", ["wrong", None])
async def test_a_wrong_or_missing_token_is_refused_with_the_engine_reason(
    token: str | None, engine_backend: EngineFactory
) -> None:
    async with EchoEngine(token="open-sesame") as engine:
        adapter = engine_backend(engine.url, api_key=token)
        result = await adapter.probe()
        assert not result.healthy
        assert result.reason == "engine refused the handshake: invalid token"
        with pytest.raises(UpstreamError) as caught:
            await adapter.chat(ask("hi"))
        assert "invalid token" in caught.value.message
        assert caught.value.retryable
        assert engine.stats.refused_handshakes == 2
        assert engine.stats.handshakes == 0
        assert engine.calls("Engine.Chat") == []
        assert adapter.connection is None


def test_an_engine_backend_needs_a_websocket_url() -> None:
    from app.routing.types import BackendSpec

    with pytest.raises(BadRequestError) as caught:
        EngineBackend(BackendSpec("e", "engine", "http://127.0.0.1:1"))
    assert (caught.value.code, caught.value.param) == ("invalid_url", "url")


# -- chat ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (1, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]),
        (
            2,
            [
                {
                    "role": "system",
                    "content": [{"mime": "text/plain", "encoding": "utf-8", "data": "be brief"}],
                },
                {
                    "role": "user",
                    "content": [{"mime": "text/plain", "encoding": "utf-8", "data": "hi"}],
                },
            ],
        ),
    ],
)
async def test_message_content_follows_the_negotiated_protocol_version(
    version: int, expected: object, engine_backend: EngineFactory
) -> None:
    async with EchoEngine(protocol_version=version) as engine:
        adapter = engine_backend(engine.url)
        result = await adapter.chat(ask("hi"))
        assert sent_messages(engine) == expected
        # The engine replies in its version's shape (a string or parts): both are read.
        assert reply_of(result.content) == "hi"
        stream = await adapter.chat_stream(ask("hi", stream=True))
        assert streamed_text(sse_events(await collect(stream))) == "hi"
        assert sent_messages(engine, "Engine.ChatStart") == expected


async def test_chat_answers_in_openai_shape(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    adapter = engine_backend(echo_engine.url)
    result = await adapter.chat(ask("what is CEP?", temperature=0.5, max_tokens=20, top_p=0.9))
    completion = msgspec.json.decode(result.content)
    assert completion["id"].startswith("chatcmpl-")
    assert completion["object"] == "chat.completion"
    assert completion["model"] == MODEL
    assert isinstance(completion["created"], int)
    assert completion["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "what is CEP?"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    prompt = count_tokens("be brief\nwhat is CEP?")
    completion_tokens = count_tokens("what is CEP?")
    assert completion["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
    assert result.usage == Usage(prompt, completion_tokens)
    assert result.completion_text_chars == 0  # usage was reported: nothing to estimate
    params = echo_engine.calls("Engine.Chat")[-1].params
    assert (params["model"], params["temperature"], params["max_tokens"]) == (MODEL, 0.5, 20)
    assert params["extra"] == {"top_p": 0.9}


async def test_usage_under_other_names_or_none(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    adapter = engine_backend(echo_engine.url)
    echo_engine.usage_names = "io"
    assert (await adapter.chat(ask("abcdefgh"))).usage == Usage(
        count_tokens("be brief\nabcdefgh"), 2
    )
    echo_engine.usage_names = "none"
    result = await adapter.chat(ask("abcdefgh"))
    assert result.usage is None
    assert result.completion_text_chars == len("abcdefgh")
    assert "usage" not in msgspec.json.decode(result.content)
    stream = await adapter.chat_stream(ask("abcdefgh", stream=True, include_usage=True))
    events = sse_events(await collect(stream))
    assert stream.usage is None
    assert stream.completion_text_chars == len("abcdefgh")
    assert all("usage" not in e for e in events if isinstance(e, dict))


async def test_a_canned_reply(echo_engine: EchoEngine, engine_backend: EngineFactory) -> None:
    echo_engine.reply = "always this"
    result = await engine_backend(echo_engine.url).chat(ask("anything"))
    assert reply_of(result.content) == "always this"


async def test_unsupported_content_is_refused_before_anything_is_sent(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    adapter = engine_backend(echo_engine.url)
    call = chat_call(
        MODEL,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
            }
        ],
    )
    with pytest.raises(BadRequestError) as caught:
        await adapter.chat(call)
    assert caught.value.code == "unsupported_content"
    with pytest.raises(BadRequestError):
        await adapter.chat_stream(call)
    assert echo_engine.calls("Engine.Chat") == echo_engine.calls("Engine.ChatStart") == []
    assert adapter.in_flight == 0


async def test_images_reach_an_engine_that_declares_them(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    echo_engine.modalities = ["text", "image"]
    adapter = engine_backend(echo_engine.url)
    image = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}}
    call = chat_call(
        MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}]
    )
    assert reply_of((await adapter.chat(call)).content) == "what?"
    (message,) = sent_messages(echo_engine)
    assert message["content"][1] == {"mime": "image/jpeg", "encoding": "base64", "data": "/9j/4AAQ"}


# -- streams ---------------------------------------------------------------------------


async def test_a_stream_becomes_openai_chunks_with_usage(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    echo_engine.chunks = 4
    echo_engine.chunk_delay = 0.02  # separate reads, so the chunks are not merged
    adapter = engine_backend(echo_engine.url)
    stream = await adapter.chat_stream(ask("stream me please", stream=True, include_usage=True))
    assert adapter.in_flight == 1
    data = await collect(stream)
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["model"] == MODEL for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed_text(events) == "stream me please"
    content_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content_chunks) >= 2
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finish] == ["stop"]
    assert chunks[-1]["choices"] == []
    prompt, completion = (
        count_tokens("be brief\nstream me please"),
        count_tokens("stream me please"),
    )
    assert chunks[-1]["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    assert stream.usage == Usage(prompt, completion)
    assert stream.completion_text_chars == len("stream me please")
    assert adapter.in_flight == 0
    assert echo_engine.stats.completed_streams == 1
    start = echo_engine.calls("Engine.ChatStart")[-1].params
    assert len(start["stream_id"]) == 36
    assert "stream" not in start.get("extra", {})


async def test_usage_is_captured_but_not_sent_without_include_usage(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    stream = await engine_backend(echo_engine.url).chat_stream(ask("quiet", stream=True))
    events = sse_events(await collect(stream))
    assert all("usage" not in e for e in events if isinstance(e, dict))
    assert stream.usage == Usage(count_tokens("be brief\nquiet"), count_tokens("quiet"))


async def test_an_engine_that_cannot_stream_still_serves_streaming_clients(
    engine_backend: EngineFactory,
) -> None:
    async with EchoEngine(streaming=False) as engine:
        adapter = engine_backend(engine.url)
        stream = await adapter.chat_stream(ask("all at once", stream=True, include_usage=True))
        assert adapter.in_flight == 0  # the whole answer is already here
        events = sse_events(await collect(stream))
        assert engine.calls("Engine.ChatStart") == []
        assert len(engine.calls("Engine.Chat")) == 1
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "all at once"}
        assert events[1]["choices"][0]["finish_reason"] == "stop"
        assert events[2]["usage"]["completion_tokens"] == count_tokens("all at once")
        assert events[3] == "[DONE]"
        assert stream.usage == Usage(count_tokens("be brief\nall at once"), 2)


async def test_a_client_leaving_a_stream_cancels_it_at_the_engine(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    echo_engine.chunks = 50
    echo_engine.chunk_delay = 0.05
    adapter = engine_backend(echo_engine.url)
    stream = await adapter.chat_stream(ask("a long answer that goes on", stream=True))
    iterator = aiter(stream)
    first = await anext(iterator)
    assert b'"role":"assistant"' in first
    await stream.aclose()
    await stream.aclose()  # idempotent
    assert adapter.in_flight == 0
    stream_id = echo_engine.calls("Engine.ChatStart")[-1].params["stream_id"]
    await eventually(lambda: stream_id in echo_engine.cancelled)
    await eventually(lambda: echo_engine.stats.cancelled_streams == 1)
    assert echo_engine.calls("Engine.ChatCancel")[-1].params == {"stream_id": stream_id}
    # Whatever the engine still sent for that stream did not hurt the connection.
    assert reply_of((await adapter.chat(ask("still here"))).content) == "still here"
    assert echo_engine.stats.connections == 1


# -- embeddings ------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [None, "float", "base64"])
async def test_embeddings(
    encoding: str | None, echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    payload: dict[str, object] = {"model": "alias", "input": ["alpha", "beta"]}
    if encoding is not None:
        payload["encoding_format"] = encoding
    result = await engine_backend(echo_engine.url).embed(
        UpstreamCall("echo-embed", raw_body(payload))
    )
    out = msgspec.json.decode(result.content)
    assert out["object"] == "list"
    assert out["model"] == "echo-embed"
    assert [d["index"] for d in out["data"]] == [0, 1]
    for item, text in zip(out["data"], ["alpha", "beta"], strict=True):
        assert item["object"] == "embedding"
        vector = item["embedding"]
        if encoding == "base64":
            raw = base64.b64decode(vector)
            vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert vector == pytest.approx(fake_vector(text), abs=1e-6)
    tokens = count_tokens("alpha") + count_tokens("beta")
    assert out["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert result.usage == Usage(tokens, 0)
    assert echo_engine.calls("Engine.Embeddings")[-1].params == {
        "model": "echo-embed",
        "input": ["alpha", "beta"],
    }


async def test_an_engine_without_embeddings_is_not_asked(engine_backend: EngineFactory) -> None:
    async with EchoEngine(embedding_models=()) as engine:
        adapter = engine_backend(engine.url)
        with pytest.raises(UpstreamError) as caught:
            await adapter.embed(UpstreamCall("echo-embed", raw_body({"input": "x"})))
        assert caught.value.retryable
        assert "does not serve embeddings" in caught.value.message
        assert engine.calls("Engine.Embeddings") == []


# -- one connection, many callers ----------------------------------------------------------


async def test_concurrent_calls_share_one_connection_and_get_their_own_replies(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    echo_engine.chat_delay = 0.05  # every call is in flight at once
    adapter = engine_backend(echo_engine.url)
    prompts = [f"question number {i}" for i in range(12)]
    # Started before any connection exists: they must share one dial, not race twelve.
    results = await asyncio.gather(*(adapter.chat(ask(p)) for p in prompts))
    assert [reply_of(r.content) for r in results] == prompts
    assert (echo_engine.stats.connections, echo_engine.stats.handshakes) == (1, 1)
    assert echo_engine.stats.chats == 12
    assert {c.connection for c in echo_engine.calls("Engine.Chat")} == {1}


async def test_concurrent_streams_are_interleaved_on_one_connection(
    echo_engine: EchoEngine, engine_backend: EngineFactory
) -> None:
    echo_engine.chunks = 6
    echo_engine.chunk_delay = 0.02
    adapter = engine_backend(echo_engine.url)
    prompts = [f"stream {i} says {'x' * i}" for i in range(5)]

    async def run(prompt: str) -> tuple[str, Usage | None]:
        stream = await adapter.chat_stream(ask(prompt, stream=True))
        return streamed_text(sse_events(await collect(stream))), stream.usage

    outcomes, plain = await asyncio.gather(
        asyncio.gather(*(run(p) for p in prompts)), adapter.chat(ask("a plain call in between"))
    )
    assert [text for text, _ in outcomes] == prompts
    assert [usage for _, usage in outcomes] == [
        Usage(count_tokens(f"be brief\n{p}"), count_tokens(p)) for p in prompts
    ]
    assert reply_of(plain.content) == "a plain call in between"
    assert echo_engine.stats.connections == 1
    assert echo_engine.stats.completed_streams == 5
    assert adapter.in_flight == 0
