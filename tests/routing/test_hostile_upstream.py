"""Adapters against an upstream that misbehaves on purpose (``app.fakes.hostile_upstream``).

Every read is bounded, garbage is never taken for an answer, and a stalled stream is
cut after the idle bound: each case fails the call instead of relaying it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from app.fakes.hostile_upstream import HostileUpstream
from app.fakes.serve import serve_asgi
from app.lib.http import UpstreamHttp, UpstreamLimits
from app.routing.backends.base import ChatStream
from app.routing.backends.ollama import OllamaBackend
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.backends.vllm import MetricsUnavailableError, VllmBackend
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.types import BackendSpec
from tests.support.upstreams import ScriptedUpstream, chat_call, drain_into, eventually

LIMITS = UpstreamLimits(
    max_body_bytes=256 * 1024,
    max_event_bytes=16 * 1024,
    max_listing_bytes=64 * 1024,
    max_error_bytes=512,
    stream_idle_seconds=0.4,
)
OVERSIZE = 8 * 1024 * 1024


@pytest.fixture(scope="module")
async def hostile() -> AsyncIterator[tuple[HostileUpstream, str]]:
    fake = HostileUpstream("hostile", models=("gpt-4o-mini",))
    async with serve_asgi(fake) as url:
        yield fake, url


@pytest.fixture
async def upstream(hostile: tuple[HostileUpstream, str]) -> tuple[HostileUpstream, str]:
    fake, url = hostile
    fake.reset()
    return fake, url


@pytest.fixture
async def bounded_http() -> AsyncIterator[UpstreamHttp]:
    client = UpstreamHttp(read_timeout=5.0, limits=LIMITS)
    yield client
    await client.aclose()


def openai(url: str, http: UpstreamHttp) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend(BackendSpec("hostile", "external", url), http)


async def drain(stream: ChatStream) -> bytes:
    return b"".join([chunk async for chunk in stream])


# -- bounded reads -------------------------------------------------------------------


@pytest.mark.parametrize("declare_length", [False, True])
async def test_an_oversize_answer_is_cut_and_its_connection_closed(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp, declare_length: bool
) -> None:
    fake, url = upstream
    fake.control.mode, fake.control.size = "oversize", OVERSIZE
    fake.control.declare_length = declare_length
    with pytest.raises(UpstreamError) as caught:
        await openai(url, bounded_http).chat(chat_call())
    assert "larger than the 262144-byte limit" in caught.value.message
    assert caught.value.status_code == 502
    # Closed, not drained: the fake is stopped long before the end of its answer.
    await eventually(lambda: fake.stats.disconnects == 1)
    assert fake.stats.bytes_sent < OVERSIZE // 2


async def test_oversize_embeddings_are_cut(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode, fake.control.size = "oversize", OVERSIZE
    call = chat_call(input="hello")
    with pytest.raises(UpstreamError, match="larger than the 262144-byte limit"):
        await openai(url, bounded_http).embed(call)


async def test_an_oversize_error_body_is_read_only_to_its_bound(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode, fake.control.size, fake.control.status = "oversize", OVERSIZE, 500
    with pytest.raises(UpstreamError) as caught:
        await openai(url, bounded_http).chat(chat_call())
    assert caught.value.upstream_status == 500
    assert len(caught.value.message.encode()) < LIMITS.max_error_bytes + 64
    await eventually(lambda: fake.stats.disconnects == 1)


async def test_an_oversize_stream_line_fails_the_stream(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode, fake.control.size = "oversize", OVERSIZE
    stream = await openai(url, bounded_http).chat_stream(chat_call(stream=True))
    with pytest.raises(StreamInterruptedError, match="longer than the 16384-byte limit"):
        await drain(stream)
    await stream.aclose()
    await eventually(lambda: fake.stats.disconnects == 1)


async def test_an_oversize_model_listing_fails_the_probe(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode, fake.control.size = "oversize", OVERSIZE
    result = await openai(url, bounded_http).probe()
    assert not result.healthy
    assert result.reason == "answer larger than the 65536-byte limit"


async def test_an_oversize_metrics_page_is_not_scraped(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode, fake.control.size = "oversize", OVERSIZE
    vllm = VllmBackend(BackendSpec("v", "vllm", url), bounded_http)
    with pytest.raises(MetricsUnavailableError, match="65536-byte limit"):
        await vllm.scrape_metrics()


async def test_a_well_behaved_answer_within_bounds_passes(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    _, url = upstream
    backend = openai(url, bounded_http)
    result = await backend.chat(chat_call())
    assert b"Hello there" in result.content
    stream = await backend.chat_stream(chat_call(stream=True))
    assert (await drain(stream)).endswith(b"data: [DONE]\n\n")
    assert (await backend.probe()).healthy


# -- garbage is not an answer ---------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("garbage", "invalid JSON body"),
        ("wrong_shape", "a chat completion without choices"),
        ("truncated", "the upstream closed the connection before its answer ended"),
    ],
)
async def test_a_broken_whole_answer_fails(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp, mode: str, reason: str
) -> None:
    fake, url = upstream
    fake.control.mode = mode  # type: ignore[assignment]
    with pytest.raises(UpstreamError, match=reason) as caught:
        await openai(url, bounded_http).chat(chat_call())
    assert caught.value.retryable  # another backend may do better


async def test_wrong_shaped_embeddings_fail(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode = "wrong_shape"
    with pytest.raises(UpstreamError, match="an embeddings answer without data"):
        await openai(url, bounded_http).embed(chat_call(input="x"))


async def test_an_error_object_sent_with_200_fails(bounded_http: UpstreamHttp) -> None:
    body = b'{"object": "error", "message": "out of memory", "code": 500}'
    async with serve_asgi(ScriptedUpstream([body], content_type=b"application/json")) as url:
        with pytest.raises(UpstreamError, match="out of memory"):
            await openai(url, bounded_http).chat(chat_call())


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("garbage", "not an event stream"),
        ("invalid_frames", "a frame that is not JSON"),
        ("wrong_shape", "a chunk without choices"),
        ("upstream_error", "upstream error: model crashed"),
        ("truncated", r"without \[DONE\]"),
    ],
)
async def test_a_broken_stream_fails_instead_of_ending_well(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp, mode: str, reason: str
) -> None:
    fake, url = upstream
    fake.control.mode = mode  # type: ignore[assignment]
    stream = await openai(url, bounded_http).chat_stream(chat_call(stream=True))
    relayed: list[bytes] = []
    with pytest.raises(StreamInterruptedError, match=reason):
        await drain_into(stream, relayed)
    # Nothing unchecked went out: no garbage, no [DONE].
    assert b"[DONE]" not in b"".join(relayed)
    assert b"<html>" not in b"".join(relayed)
    assert b"not json" not in b"".join(relayed)


async def test_a_stalled_stream_is_cut_after_the_idle_bound(
    upstream: tuple[HostileUpstream, str], bounded_http: UpstreamHttp
) -> None:
    fake, url = upstream
    fake.control.mode = "stall"
    stream = await openai(url, bounded_http).chat_stream(chat_call(stream=True))
    started = time.monotonic()
    with pytest.raises(StreamInterruptedError, match=r"no data for 0\.4s"):
        await drain(stream)
    # Cut by the idle bound, well before the 5 s read timeout.
    assert time.monotonic() - started < 4.0
    await eventually(lambda: fake.stats.disconnects == 1)


# -- Ollama's NDJSON ------------------------------------------------------------------


def ndjson(*lines: bytes) -> list[bytes]:
    return [line + b"\n" for line in lines]


OLLAMA_PIECE = b'{"message": {"role": "assistant", "content": "hi"}, "done": false}'
OLLAMA_DONE = b'{"message": {"role": "assistant", "content": ""}, "done": true}'


@pytest.mark.parametrize(
    ("pieces", "reason"),
    [
        (ndjson(OLLAMA_PIECE, b"<html>oops</html>", OLLAMA_DONE), "a line that is not JSON"),
        (ndjson(OLLAMA_PIECE), "before its last line"),
        ([OLLAMA_PIECE + b"x" * (32 * 1024)], "longer than 16384 bytes"),
    ],
)
async def test_a_broken_ollama_stream_fails(
    bounded_http: UpstreamHttp, pieces: list[bytes], reason: str
) -> None:
    scripted = ScriptedUpstream(pieces, content_type=b"application/x-ndjson")
    async with serve_asgi(scripted) as url:
        backend = OllamaBackend(BackendSpec("o", "ollama", url), bounded_http)
        stream = await backend.chat_stream(chat_call(stream=True))
        with pytest.raises(StreamInterruptedError, match=reason):
            await drain(stream)


async def test_a_wrong_shaped_ollama_answer_fails(bounded_http: UpstreamHttp) -> None:
    scripted = ScriptedUpstream([b'{"done": true}'], content_type=b"application/json")
    async with serve_asgi(scripted) as url:
        backend = OllamaBackend(BackendSpec("o", "ollama", url), bounded_http)
        with pytest.raises(UpstreamError, match="without a message"):
            await backend.chat(chat_call())
