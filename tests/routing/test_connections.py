"""The upstream client's connections: pooled when an answer was read whole, closed when
it was abandoned (so the upstream stops generating), and the client's own lifecycle."""

from __future__ import annotations

import msgspec
import pytest

from app.fakes import FakeOllama, FakeOpenAI, serve_asgi
from app.lib.http import USER_AGENT, UpstreamHttp, build_http_client
from app.routing.backends.ollama import OllamaBackend
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.errors import UpstreamError
from app.routing.types import BackendSpec
from tests.support.upstreams import ScriptedUpstream, Served, chat_call, collect, eventually

ANSWER = msgspec.json.encode(
    {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
)
FRAME = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def openai(url: str, http: UpstreamHttp) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend(BackendSpec("b1", "external", url), http)


async def test_sequential_calls_reuse_the_pooled_connection(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream([ANSWER], content_type=b"application/json", pause=0)
    async with serve_asgi(upstream) as url:
        adapter = openai(url, http)
        for _ in range(3):
            assert (await adapter.chat(chat_call())).usage is not None
    assert len(upstream.client_ports) == 3
    assert len(set(upstream.client_ports)) == 1


async def test_a_fully_read_stream_returns_its_connection(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream([FRAME, DONE], pause=0)
    async with serve_asgi(upstream) as url:
        adapter = openai(url, http)
        for _ in range(2):
            stream = await adapter.chat_stream(chat_call(stream=True))
            assert await collect(stream) == FRAME + DONE
            await stream.aclose()
    assert len(set(upstream.client_ports)) == 1


async def test_a_small_error_answer_keeps_the_connection(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream([b'{"error": "busy"}'], status=503, pause=0)
    async with serve_asgi(upstream) as url:
        adapter = openai(url, http)
        for _ in range(2):
            with pytest.raises(UpstreamError) as caught:
                await adapter.chat(chat_call())
            assert caught.value.upstream_status == 503
    assert len(set(upstream.client_ports)) == 1


async def test_an_abandoned_stream_closes_its_connection(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream([FRAME] * 100, pause=0.02)
    async with serve_asgi(upstream) as url:
        adapter = openai(url, http)
        stream = await adapter.chat_stream(chat_call(stream=True))
        assert await anext(aiter(stream)) == FRAME
        await stream.aclose()
        upstream.pieces = [FRAME, DONE]
        again = await adapter.chat_stream(chat_call(stream=True))
        assert await collect(again) == FRAME + DONE
    [abandoned, fresh] = upstream.client_ports
    assert abandoned != fresh  # the abandoned connection was not put back in the pool


async def test_an_abandoned_stream_is_seen_as_a_disconnect(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    fake = openai_upstream.fake
    fake.control.chunks = 500
    fake.control.chunk_delay_seconds = 0.01
    stream = await openai(openai_upstream.url, http).chat_stream(chat_call(stream=True))
    await stream.aclose()  # before reading anything
    await eventually(lambda: fake.stats.disconnects == 1)
    assert fake.stats.completed_streams == 0
    assert fake.stats.in_flight == 0


async def test_an_abandoned_ollama_stream_is_seen_as_a_disconnect(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    fake = ollama_upstream.fake
    fake.control.chunks = 500
    fake.control.chunk_delay_seconds = 0.01
    adapter = OllamaBackend(BackendSpec("ol", "ollama", ollama_upstream.url), http)
    stream = await adapter.chat_stream(chat_call("llama3:latest", stream=True))
    assert (await anext(aiter(stream))).startswith(b"data: ")
    await stream.aclose()
    await stream.aclose()  # idempotent
    await eventually(lambda: fake.stats.disconnects == 1)
    assert fake.stats.completed_streams == 0


async def test_requests_carry_the_user_agent_and_never_cookies(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream(
        [ANSWER],
        content_type=b"application/json",
        pause=0,
        headers=[(b"set-cookie", b"session=abc; Path=/")],
    )
    async with serve_asgi(upstream) as url:
        adapter = openai(url, http)
        await adapter.chat(chat_call())
        await adapter.chat(chat_call())
    [first, second] = upstream.request_headers
    assert first[b"user-agent"] == USER_AGENT.encode()
    assert b"cookie" not in second


async def test_redirects_are_not_followed(http: UpstreamHttp) -> None:
    target = ScriptedUpstream([ANSWER], content_type=b"application/json", pause=0)
    async with serve_asgi(target) as elsewhere:
        redirect = ScriptedUpstream(
            [b"moved"],
            status=307,
            content_type=b"text/plain",
            pause=0,
            headers=[(b"location", f"{elsewhere}/v1/chat/completions".encode())],
        )
        async with serve_asgi(redirect) as url:
            with pytest.raises(UpstreamError) as caught:
                await openai(url, http).chat(chat_call())
    assert caught.value.upstream_status == 307
    assert target.paths == []  # the prompt went nowhere else


async def test_client_opens_its_session_lazily_and_closes_for_good() -> None:
    client = build_http_client(connect_timeout=1.0, read_timeout=2.0)
    assert client.timeout.sock_read == 2.0
    assert client.timeout.sock_connect == 1.0
    assert client.timeout.total is None
    upstream = ScriptedUpstream([ANSWER], content_type=b"application/json", pause=0)
    async with serve_asgi(upstream) as url:
        await openai(url, client).chat(chat_call())
        session = client.session
        assert client.session is session  # one session for every call
        await client.aclose()
        assert session.closed
        assert client.closed
        with pytest.raises(RuntimeError):
            await openai(url, client).chat(chat_call())
    await client.aclose()  # idempotent


async def test_closing_an_unused_client_is_fine() -> None:
    client = build_http_client()
    await client.aclose()
    assert client.closed
