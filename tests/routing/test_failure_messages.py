"""Failures of HTTP upstreams, as the client will read them: the situation in plain
words (never an exception's class or a library's text), the upstream's status, and
a throttling upstream's ``Retry-After``."""

from __future__ import annotations

import re

import pytest

from app.fakes import FakeOllama, FakeOpenAI, serve_asgi
from app.lib.http import UpstreamHttp
from app.routing.backends.ollama import OllamaBackend
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.types import BackendSpec
from tests.support.upstreams import ScriptedUpstream, Served, chat_call, drain_into

LIBRARY_WORDS = re.compile(
    r"[A-Z][a-z]+(?:[A-Z][a-z]+)*(?:Error|Exception)|aiohttp|ClientConnector"
)


def assert_plain(message: str) -> None:
    assert not LIBRARY_WORDS.search(message), message
    assert "<" not in message, message  # no repr of anything


def openai(url: str, http: UpstreamHttp) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend(BackendSpec("b1", "external", url), http)


async def test_a_refused_connection_says_it_could_not_connect(
    refused_url: str, http: UpstreamHttp
) -> None:
    adapter = openai(refused_url, http)
    for attempt in (
        adapter.chat(chat_call()),
        adapter.chat_stream(chat_call(stream=True)),
        adapter.embed(chat_call(input="x")),
    ):
        with pytest.raises(UpstreamError) as caught:
            await attempt
        assert caught.value.message == "could not connect to the upstream: connection refused"
        assert caught.value.upstream_status is None
        assert "upstream_status" not in caught.value.body()["error"]


async def test_a_read_timeout_says_how_long_it_waited(
    openai_upstream: Served[FakeOpenAI], short_http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.hang = True
    adapter = openai(openai_upstream.url, short_http)
    for attempt in (adapter.chat(chat_call()), adapter.chat_stream(chat_call(stream=True))):
        with pytest.raises(UpstreamError) as caught:
            await attempt
        assert caught.value.message == "the upstream did not answer within 0.5s"
        assert caught.value.upstream_status is None


async def test_a_stream_silent_after_its_headers_says_so(short_http: UpstreamHttp) -> None:
    # Headers at once, then nothing for longer than the read timeout (0.5 s).
    upstream = ScriptedUpstream([b"", b"data: [DONE]\n\n"], pause=1.5)
    async with serve_asgi(upstream) as url:
        stream = await openai(url, short_http).chat_stream(chat_call(stream=True))
        with pytest.raises(StreamInterruptedError) as caught:
            await drain_into(stream, [])
    assert caught.value.message == (
        "upstream stream interrupted: the upstream sent no data within 0.5s"
    )
    assert caught.value.upstream_status == 200


async def test_a_stream_cut_midway_says_the_upstream_closed_it(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.drop_stream_after = 2
    stream = await openai(openai_upstream.url, http).chat_stream(chat_call(stream=True))
    received: list[bytes] = []
    with pytest.raises(StreamInterruptedError) as caught:
        await drain_into(stream, received)
    assert received  # it had started
    message = caught.value.message
    assert message == "upstream stream interrupted: the upstream closed the stream before it ended"
    assert_plain(message)
    assert caught.value.body()["error"]["upstream_status"] == 200


async def test_an_ollama_stream_cut_midway_says_the_same(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    ollama_upstream.fake.control.drop_stream_after = 2
    adapter = OllamaBackend(BackendSpec("o1", "ollama", ollama_upstream.url), http)
    stream = await adapter.chat_stream(
        chat_call(ollama_upstream.fake.control.models[0], stream=True)
    )
    with pytest.raises(StreamInterruptedError) as caught:
        await drain_into(stream, [])
    assert caught.value.message.endswith("the upstream closed the stream before it ended")
    assert caught.value.upstream_status == 200


async def test_a_429s_retry_after_travels_with_the_error(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    control = openai_upstream.fake.control
    control.fail_status, control.retry_after = 429, "17"
    adapter = openai(openai_upstream.url, http)
    for attempt in (
        adapter.chat(chat_call()),
        adapter.chat_stream(chat_call(stream=True)),
        adapter.embed(chat_call(input="x")),
    ):
        with pytest.raises(UpstreamError) as caught:
            await attempt
        assert caught.value.upstream_status == 429
        assert caught.value.retryable
        assert caught.value.headers == {"Retry-After": "17"}


async def test_a_client_error_tells_the_sdk_not_to_retry(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    control = openai_upstream.fake.control
    control.fail_status, control.retry_after = 400, "17"
    with pytest.raises(UpstreamError) as caught:
        await openai(openai_upstream.url, http).chat(chat_call())
    assert caught.value.headers == {"x-should-retry": "false"}
    assert caught.value.body()["error"]["upstream_status"] == 400
