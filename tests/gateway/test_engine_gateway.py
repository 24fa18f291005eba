"""A CEP engine backend end to end: registered through the admin API with a ws:// URL,
called with the official ``openai`` SDK, metered like any other backend."""

from __future__ import annotations

from typing import TypeVar

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.fakes.content import count_tokens, fake_vector
from app.fakes.engine_echo import EchoEngine, UpgradeRefusal
from app.fakes.engine_misbehaving import MisbehavingEngine, Misbehaviour
from app.routing.backends.engine import EngineBackend
from tests.support.api import eventually
from tests.support.gateway import GatewayEnv, unique

TOKEN = "engine-handshake-token"
E = TypeVar("E", bound=EchoEngine)


def ask(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


async def start(env: GatewayEnv, engine: E) -> E:
    await engine.start()
    env.stack.push_async_callback(engine.stop)
    return engine


async def test_chat_streams_and_embeddings_through_an_engine_are_metered(
    env: GatewayEnv,
) -> None:
    chat_model, embed_model = unique("cep-chat"), unique("cep-embed")
    engine = await start(
        env,
        EchoEngine(models=[chat_model], embedding_models=[embed_model], token=TOKEN, chunks=3),
    )
    engine.chunk_delay = 0.01
    name = unique("engine")
    created = await env.register(name, engine.url, type="engine", api_key=TOKEN)
    assert created["type"] == "engine"
    assert created["has_api_key"] is True
    view = await env.backend(name)
    assert view["advertised_models"] == [chat_model, embed_model]
    assert engine.handshakes[0]["token"] == TOKEN
    sdk = env.sdk()

    reply = await sdk.chat.completions.create(model=chat_model, messages=ask("plain question"))
    assert reply.choices[0].message.content == "plain question"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == count_tokens("plain question")

    stream = await sdk.chat.completions.create(
        model=chat_model,
        messages=ask("streamed question"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed question"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    streamed_tokens = chunks[-1].usage.total_tokens
    assert streamed_tokens == 2 * count_tokens("streamed question")

    quiet = await sdk.chat.completions.create(
        model=chat_model, messages=ask("no usage asked"), stream=True
    )
    quiet_chunks = [chunk async for chunk in quiet]
    assert all(c.usage is None for c in quiet_chunks)

    floats = await sdk.embeddings.create(
        model=embed_model, input=["one", "two"], encoding_format="float"
    )
    assert floats.data[1].embedding == pytest.approx(fake_vector("two"), abs=1e-6)
    # The SDK asks for base64 unless told otherwise, and decodes it back to floats.
    packed = await sdk.embeddings.create(model=embed_model, input="three")
    assert packed.data[0].embedding == pytest.approx(fake_vector("three"), abs=1e-6)

    assert engine.stats.connections == 1  # probes and every call share one connection
    assert (engine.stats.chats, engine.stats.streams, engine.stats.embeddings) == (1, 2, 2)

    rows = [r for r in await env.usage_rows() if r.backend == name]
    assert len(rows) == 5
    assert all(r.status == 200 and not r.estimated for r in rows)
    chats = [r for r in rows if r.endpoint == "chat"]
    assert [r.streamed for r in chats] == [False, True, True]
    assert chats[0].total_tokens == reply.usage.total_tokens
    assert chats[1].total_tokens == streamed_tokens
    # Usage the client did not ask for is still metered with the engine's numbers.
    assert chats[2].completion_tokens == count_tokens("no usage asked")
    assert all(r.model_served == chat_model for r in chats)
    embeddings = [r for r in rows if r.endpoint == "embeddings"]
    assert [r.prompt_tokens for r in embeddings] == [
        count_tokens("one") + count_tokens("two"),
        count_tokens("three"),
    ]


async def test_an_engine_refusing_the_token_is_unhealthy_and_never_routed(
    env: GatewayEnv,
) -> None:
    model = unique("cep-locked")
    engine = await start(env, EchoEngine(models=[model], token=TOKEN))
    name = unique("engine")
    await env.register(name, engine.url, type="engine", api_key="not-the-token", healthy=False)
    await env.wait_health(name, "unhealthy")
    health = (await env.backend(name))["health"]
    assert health["reason"] == "engine refused the handshake: invalid token"
    assert engine.stats.refused_handshakes >= 1
    # Its models were never discovered, so nothing routes to it.
    with pytest.raises(openai.NotFoundError):
        await env.sdk().chat.completions.create(model=model, messages=ask("hello?"))
    assert engine.stats.chats == 0


async def test_an_engine_dropping_mid_stream_ends_the_stream_with_an_error(
    env: GatewayEnv,
) -> None:
    model = unique("cep-drop")
    engine = await start(env, MisbehavingEngine(models=[model], chunks=6))
    engine.chunk_delay = 0.02
    name = unique("engine")
    await env.register(name, engine.url, type="engine")
    engine.mode, engine.drop_after = Misbehaviour.DROP_MID_STREAM, 2
    async with env.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": model, "messages": ask("cut me off halfway"), "stream": True},
        headers={"Authorization": f"Bearer {env.api_key}"},
    ) as response:
        assert response.status_code == 200
        body = b"".join([part async for part in response.aiter_bytes()])
    assert b'"role":"assistant"' in body
    assert b"event: error" in body
    assert body.endswith(b"data: [DONE]\n\n")
    (row,) = [r for r in await env.usage_rows() if r.backend == name]
    assert (row.status, row.error_code, row.streamed) == (502, "bad_gateway", True)

    # The next call dials a fresh connection and is served.
    engine.mode = Misbehaviour.NONE
    reply = await env.sdk().chat.completions.create(model=model, messages=ask("again"))
    assert reply.choices[0].message.content == "again"
    assert engine.stats.handshakes == 2


async def test_a_throttled_engines_retry_after_reaches_the_sdk(env: GatewayEnv) -> None:
    """An engine that answers its WebSocket upgrade with a 429 is told to the client as
    an OpenAI-compatible upstream's 429 is: a 502 with ``upstream_status`` and the
    engine's ``Retry-After``."""
    model = unique("cep-429")
    engine = await start(env, EchoEngine(models=[model]))
    name = unique("engine")
    await env.register(name, engine.url, type="engine")
    state = env.resources.backend_registry.get(name)
    assert state is not None
    assert isinstance(state.adapter, EngineBackend)
    adapter = state.adapter
    engine.upgrade_refusal = UpgradeRefusal(429, "9")
    await engine.drop_connections()  # the next call has to dial, and is throttled

    async def redial_needed() -> bool:
        return adapter.connection is None

    await eventually(redial_needed, within=5.0)
    sdk = env.sdk()
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model=model, messages=ask("hi"), stream=stream)
        assert info.value.status_code == 502
        assert info.value.response.headers["retry-after"] == "9"
        assert "x-should-retry" not in info.value.response.headers
        body = info.value.body
        assert isinstance(body, dict)
        assert body["upstream_status"] == 429
