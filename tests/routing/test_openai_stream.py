"""OpenAI-compatible adapter: streamed chat relayed byte for byte, usage captured."""

from __future__ import annotations

import msgspec
import pytest

from app.fakes import FakeOpenAI, serve_asgi
from app.lib.http import UpstreamHttp
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.types import BackendSpec, Usage
from tests.support.upstreams import (
    ScriptedUpstream,
    Served,
    chat_call,
    collect,
    drain_into,
    eventually,
    sse_events,
    streamed_text,
)


def backend(url: str, http: UpstreamHttp) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend(BackendSpec("b1", "external", url), http)


async def test_stream_relays_chunks_and_keeps_requested_usage(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    stream = await backend(openai_upstream.url, http).chat_stream(
        chat_call(stream=True, include_usage=True)
    )
    events = sse_events(await collect(stream))
    assert events[-1] == "[DONE]"
    assert streamed_text(events) == "Hello from alpha"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    usage_chunks = [e for e in events[:-1] if e["choices"] == [] and e.get("usage")]
    assert len(usage_chunks) == 1
    assert usage_chunks[0]["usage"]["completion_tokens"] == 5
    assert stream.usage == Usage(prompt_tokens=2, completion_tokens=5)
    sent = openai_upstream.fake.requests_for("/chat/completions")[0].body
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["model"] == "gpt-4o-mini"


async def test_stream_drops_unrequested_usage_chunk_but_captures_usage(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    call = chat_call(stream=True, stream_options={"include_obfuscation": False})
    stream = await backend(openai_upstream.url, http).chat_stream(call)
    raw = await collect(stream)
    events = sse_events(raw)
    assert not [e for e in events if isinstance(e, dict) and e["choices"] == []]
    assert events[-1] == "[DONE]"
    assert streamed_text(events) == "Hello from alpha"
    assert b"\n\n\n" not in raw  # the dropped event left no stray blank line
    assert stream.usage == Usage(prompt_tokens=2, completion_tokens=5)
    # The upstream was always asked for usage; the client's other options were kept.
    sent = openai_upstream.fake.requests_for("/chat/completions")[0].body
    assert sent["stream_options"] == {"include_obfuscation": False, "include_usage": True}


async def test_stream_without_usage_counts_text(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.report_usage = False
    openai_upstream.fake.control.chunks = 7
    stream = await backend(openai_upstream.url, http).chat_stream(
        chat_call(stream=True, include_usage=True)
    )
    events = sse_events(await collect(stream))
    assert stream.usage is None
    assert stream.completion_text_chars == len("Hello from alpha")
    assert streamed_text(events) == "Hello from alpha"
    assert len([e for e in events if isinstance(e, dict)]) == 9  # role + 7 pieces + finish


async def test_stream_count_text_can_be_switched_off(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.report_usage = False
    stream = await backend(openai_upstream.url, http).chat_stream(chat_call(stream=True))
    stream.count_text = False
    await collect(stream)
    assert stream.completion_text_chars == 0


async def test_stream_drop_raises_stream_interrupted(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.drop_stream_after = 3
    stream = await backend(openai_upstream.url, http).chat_stream(chat_call(stream=True))
    received: list[bytes] = []
    with pytest.raises(StreamInterruptedError) as caught:
        await drain_into(stream, received)
    assert not caught.value.retryable
    assert caught.value.message == (
        "upstream stream interrupted: the upstream closed the stream before it ended"
    )
    assert caught.value.upstream_status == 200  # the status the stream began with
    events = sse_events(b"".join(received))
    assert len(events) == 3
    assert "[DONE]" not in events
    await stream.aclose()  # still safe after the failure
    assert openai_upstream.fake.stats.dropped_streams == 1


async def test_stream_aclose_midway_releases_the_upstream(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    fake = openai_upstream.fake
    fake.control.chunks = 500
    fake.control.chunk_delay_seconds = 0.01
    adapter = backend(openai_upstream.url, http)
    stream = await adapter.chat_stream(chat_call(stream=True))
    iterator = aiter(stream)
    first = await anext(iterator)
    assert first.startswith(b"data: ")
    await stream.aclose()
    await stream.aclose()  # idempotent
    await eventually(lambda: fake.stats.disconnects == 1)
    assert fake.stats.completed_streams == 0
    with pytest.raises(StopAsyncIteration):
        await anext(iterator)
    fake.control.chunks = 2
    fake.control.chunk_delay_seconds = 0
    events = sse_events(await collect(await adapter.chat_stream(chat_call(stream=True))))
    assert events[-1] == "[DONE]"
    assert fake.stats.in_flight == 0


async def test_stream_error_status_raises_before_any_byte(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.fail_status = 503
    with pytest.raises(UpstreamError) as caught:
        await backend(openai_upstream.url, http).chat_stream(chat_call(stream=True))
    assert caught.value.upstream_status == 503
    assert caught.value.retryable
    assert not isinstance(caught.value, StreamInterruptedError)


async def test_stream_open_connection_refused(refused_url: str, http: UpstreamHttp) -> None:
    with pytest.raises(UpstreamError) as caught:
        await backend(refused_url, http).chat_stream(chat_call(stream=True))
    assert caught.value.retryable
    assert "connection refused" in caught.value.message


def chunk_line(payload: dict[str, object]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


CONTENT = chunk_line({"choices": [{"index": 0, "delta": {"content": "split"}}]})
USAGE = chunk_line({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})


async def test_stream_handles_lines_split_across_reads(http: UpstreamHttp) -> None:
    middle = len(USAGE) // 2
    pieces = [CONTENT[:10], CONTENT[10:] + USAGE[:middle], USAGE[middle:], b"data: [DONE]\n\n"]
    async with serve_asgi(ScriptedUpstream(pieces)) as url:
        stream = await backend(url, http).chat_stream(chat_call(stream=True))
        raw = await collect(stream)
    assert raw == CONTENT + b"data: [DONE]\n\n"
    assert stream.usage == Usage(9, 4)


async def test_stream_usage_split_between_its_line_and_blank_line(http: UpstreamHttp) -> None:
    pieces = [CONTENT, USAGE[:-1], USAGE[-1:] + CONTENT, b"data: [DONE]\n\n"]
    async with serve_asgi(ScriptedUpstream(pieces)) as url:
        stream = await backend(url, http).chat_stream(chat_call(stream=True))
        raw = await collect(stream)
    assert raw == CONTENT + CONTENT + b"data: [DONE]\n\n"
    assert stream.usage == Usage(9, 4)


async def test_stream_without_done_fails_after_what_it_relayed(http: UpstreamHttp) -> None:
    # A clean close without [DONE] may have cut the answer anywhere: never a success.
    async with serve_asgi(ScriptedUpstream([CONTENT, CONTENT[:-1]])) as url:
        stream = await backend(url, http).chat_stream(chat_call(stream=True))
        relayed: list[bytes] = []
        with pytest.raises(StreamInterruptedError, match=r"without \[DONE\]"):
            await drain_into(stream, relayed)
    assert b"".join(relayed) == CONTENT + CONTENT[:-1]
    assert stream.completion_text_chars == len("splitsplit")


async def test_stream_usage_in_every_chunk_is_kept(http: UpstreamHttp) -> None:
    # vLLM's continuous usage stats: usage rides on content chunks, which stay.
    pieces = [
        chunk_line({"choices": [{"delta": {"content": "a"}}], "usage": {"prompt_tokens": 3}}),
        chunk_line(
            {
                "choices": [{"delta": {"content": "b"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            }
        ),
        b"data: [DONE]\n\n",
    ]
    async with serve_asgi(ScriptedUpstream(pieces)) as url:
        stream = await backend(url, http).chat_stream(chat_call(stream=True))
        raw = await collect(stream)
    assert raw == b"".join(pieces)
    assert stream.usage == Usage(3, 2)


async def test_an_upstream_refusing_stream_options_is_streamed_without_them(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    fake = openai_upstream.fake
    fake.control.reject_stream_options = True
    adapter = backend(openai_upstream.url, http)
    stream = await adapter.chat_stream(chat_call(stream=True))
    events = sse_events(await collect(stream))
    assert events[-1] == "[DONE]"
    assert streamed_text(events) == "Hello from alpha"
    assert stream.usage is None  # nothing reported: the caller estimates
    assert stream.completion_text_chars == len("Hello from alpha")
    first, second = fake.requests_for("/chat/completions")
    assert "stream_options" in first.body
    assert "stream_options" not in second.body
    # Learned: the next stream goes out without the field at once.
    await collect(await adapter.chat_stream(chat_call(stream=True)))
    assert len(fake.requests_for("/chat/completions")) == 3
    assert "stream_options" not in fake.requests_for("/chat/completions")[2].body


async def test_the_clients_own_stream_options_refused_is_the_clients_error(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.reject_stream_options = True
    adapter = backend(openai_upstream.url, http)
    with pytest.raises(UpstreamError) as info:
        await adapter.chat_stream(chat_call(stream=True, stream_options={"include_usage": True}))
    assert info.value.upstream_status == 400
    assert len(openai_upstream.fake.requests_for("/chat/completions")) == 1
