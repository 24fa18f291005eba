"""OpenAI-compatible adapter: non-streaming chat, embeddings, errors and auth."""

from __future__ import annotations

import msgspec
import pytest

from app.fakes import FakeOpenAI, serve_asgi
from app.lib.http import UpstreamHttp
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.errors import MAX_UPSTREAM_DETAIL_BYTES, UpstreamError
from app.routing.types import BackendSpec, UpstreamCall, Usage
from tests.support.upstreams import (
    PATH_PREFIX,
    UPSTREAM_KEY,
    ScriptedUpstream,
    Served,
    chat_call,
    raw_body,
)


def backend(url: str, http: UpstreamHttp, api_key: str | None = None) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend(BackendSpec("b1", "external", url, api_key=api_key), http)


async def test_chat_relays_the_answer_and_parses_usage(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    result = await backend(openai_upstream.url, http).chat(chat_call("gpt-4o-mini"))
    answer = msgspec.json.decode(result.content)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == "Hello from alpha"
    assert result.usage == Usage(prompt_tokens=2, completion_tokens=5)
    assert result.completion_text_chars == 0  # usage was reported: nothing to count
    sent = openai_upstream.fake.requests_for("/v1/chat/completions")[0].body
    assert sent["model"] == "gpt-4o-mini"  # the backend's name replaced the client's
    assert sent["messages"] == [{"role": "user", "content": "Say hello"}]


async def test_chat_relays_upstream_bytes_unchanged(http: UpstreamHttp) -> None:
    body = (
        b'{ "id": "x",  "object": "chat.completion", "choices": [{"index": 0, '
        b'"message": {"role": "assistant", "content": "caf\\u00e9"}}],'
        b' "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},'
        b' "vendor_extra": {"keep": [1, 2, 3]} }'
    )
    upstream = ScriptedUpstream([body], content_type=b"application/json", pause=0)
    async with serve_asgi(upstream) as url:
        result = await backend(url, http).chat(chat_call())
    assert result.content == body
    assert result.usage == Usage(11, 3)


async def test_chat_relays_unknown_fields_and_values_untouched(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    call = chat_call(temperature=0.25, vendor_param={"deep": [1, "two"]}, stream_options={"x": 1})
    await backend(openai_upstream.url, http).chat(call)
    sent = openai_upstream.fake.requests_for("/chat/completions")[0].body
    assert sent["temperature"] == 0.25
    assert sent["vendor_param"] == {"deep": [1, "two"]}
    assert "stream_options" not in sent  # only valid with stream: true


async def test_chat_without_usage_counts_completion_text(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.report_usage = False
    openai_upstream.fake.control.content = "twelve chars"
    result = await backend(openai_upstream.url, http).chat(chat_call())
    assert result.usage is None
    assert result.completion_text_chars == len("twelve chars")


async def test_chat_path_style_base(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    result = await backend(openai_upstream.url + PATH_PREFIX, http).chat(chat_call())
    assert b"Hello from alpha" in result.content
    assert [r.path for r in openai_upstream.fake.requests] == [f"{PATH_PREFIX}/chat/completions"]


async def test_chat_sends_only_the_backend_key(
    keyed_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    await backend(keyed_upstream.url, http, api_key=UPSTREAM_KEY).chat(chat_call())
    headers = keyed_upstream.fake.requests[0].headers
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sum(1 for value in headers.values() if "Bearer" in value) == 1


async def test_chat_without_a_backend_key_sends_no_authorization(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    await backend(openai_upstream.url, http).chat(chat_call())
    assert "authorization" not in openai_upstream.fake.requests[0].headers


async def test_chat_wrong_key_is_a_non_retryable_401(
    keyed_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    with pytest.raises(UpstreamError) as caught:
        await backend(keyed_upstream.url, http, api_key="sk-wrong").chat(chat_call())
    assert caught.value.upstream_status == 401
    assert not caught.value.retryable
    assert "Incorrect API key" in caught.value.message


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (429, True), (400, False)]
)
async def test_chat_error_status(
    status: int, retryable: bool, openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.fail_status = status
    openai_upstream.fake.control.fail_message = "upstream is sad"
    with pytest.raises(UpstreamError) as caught:
        await backend(openai_upstream.url, http).chat(chat_call())
    assert caught.value.upstream_status == status
    assert caught.value.retryable is retryable
    assert "upstream is sad" in caught.value.message


async def test_chat_error_detail_is_bounded_to_4kb(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.fail_status = 502
    openai_upstream.fake.control.fail_message = "E" * 50_000
    with pytest.raises(UpstreamError) as caught:
        await backend(openai_upstream.url, http).chat(chat_call())
    message = caught.value.message
    assert message.startswith("upstream 502: ")
    assert message.endswith("…")
    assert len(message.encode()) <= MAX_UPSTREAM_DETAIL_BYTES + 64
    # The connection is usable afterwards: the unread rest of the body was discarded.
    openai_upstream.fake.control.fail_status = None
    assert (await backend(openai_upstream.url, http).chat(chat_call())).usage is not None


async def test_chat_connection_refused_is_a_retryable_transport_error(
    refused_url: str, http: UpstreamHttp
) -> None:
    with pytest.raises(UpstreamError) as caught:
        await backend(refused_url, http).chat(chat_call())
    assert caught.value.upstream_status is None
    assert caught.value.retryable
    assert "connection refused" in caught.value.message


async def test_chat_hang_times_out_as_transport_error(
    openai_upstream: Served[FakeOpenAI], short_http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.hang = True
    with pytest.raises(UpstreamError) as caught:
        await backend(openai_upstream.url, short_http).chat(chat_call())
    assert caught.value.upstream_status is None
    assert caught.value.message == "the upstream did not answer within 0.5s"


async def test_chat_non_json_success_is_an_upstream_error(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream([b"<html>oops</html>"], content_type=b"text/html", pause=0)
    async with serve_asgi(upstream) as url:
        with pytest.raises(UpstreamError) as caught:
            await backend(url, http).chat(chat_call())
    assert "invalid JSON" in caught.value.message
    assert caught.value.retryable


def embed_call(value: object, **fields: object) -> UpstreamCall:
    body = raw_body({"model": "client-alias", "input": value, **fields})
    return UpstreamCall("text-embedding-3-small", body)


async def test_embeddings_string_input(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    result = await backend(openai_upstream.url, http).embed(embed_call("hello world!"))
    answer = msgspec.json.decode(result.content)
    assert [item["index"] for item in answer["data"]] == [0]
    assert len(answer["data"][0]["embedding"]) == 8
    assert result.usage == Usage(prompt_tokens=3, completion_tokens=0)
    sent = openai_upstream.fake.requests_for("/v1/embeddings")[0].body
    assert sent["model"] == "text-embedding-3-small"


async def test_embeddings_list_input_is_deterministic(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    adapter = backend(openai_upstream.url + PATH_PREFIX, http)
    first = msgspec.json.decode((await adapter.embed(embed_call(["a", "b"]))).content)
    again = msgspec.json.decode((await adapter.embed(embed_call(["b"]))).content)
    assert [item["index"] for item in first["data"]] == [0, 1]
    assert first["data"][1]["embedding"] == again["data"][0]["embedding"]
    assert first["data"][0]["embedding"] != first["data"][1]["embedding"]


async def test_embeddings_error_and_missing_usage(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.report_usage = False
    result = await backend(openai_upstream.url, http).embed(embed_call("x"))
    assert result.usage is None
    openai_upstream.fake.control.fail_status = 500
    with pytest.raises(UpstreamError) as caught:
        await backend(openai_upstream.url, http).embed(embed_call("x"))
    assert caught.value.upstream_status == 500
