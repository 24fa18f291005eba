"""Ollama adapter: probes, OpenAI <-> Ollama translation (chat, stream, tools, embeddings)."""

from __future__ import annotations

import base64
import struct

import msgspec
import pytest

from app.fakes import FakeOllama
from app.fakes.content import fake_vector
from app.lib.http import PROBE_TIMEOUT_SECONDS, UpstreamHttp
from app.routing.backends.ollama import OllamaBackend
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.types import BackendSpec, UpstreamCall, Usage
from tests.support.upstreams import (
    Served,
    chat_call,
    collect,
    drain_into,
    raw_body,
    sse_events,
    streamed_text,
)

MODEL = "llama3:latest"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def backend(url: str, http: UpstreamHttp) -> OllamaBackend:
    spec = BackendSpec("ol", "ollama", url, api_key="ignored", models=("static-model",))
    return OllamaBackend(spec, http)


def last_chat(fake: FakeOllama) -> dict[str, object]:
    body = fake.requests_for("/api/chat")[-1].body
    assert isinstance(body, dict)
    return body


async def test_probe_lists_tags_and_ignores_static_models(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    adapter = backend(ollama_upstream.url, http)
    result = await adapter.probe()
    assert result.healthy
    assert result.models == ("llama3:latest", "nomic-embed-text:latest")
    assert adapter.spec.models == ()
    assert adapter.spec.api_key is None
    assert "authorization" not in ollama_upstream.fake.requests[0].headers


@pytest.mark.parametrize(
    ("switch", "value", "reason"),
    [
        ("fail_status", 500, "status 500"),
        ("listing_404", True, "status 404"),
        ("hang", True, f"timeout after {PROBE_TIMEOUT_SECONDS}s"),
    ],
)
async def test_probe_failures(
    switch: str,
    value: object,
    reason: str,
    ollama_upstream: Served[FakeOllama],
    http: UpstreamHttp,
) -> None:
    setattr(ollama_upstream.fake.control, switch, value)
    result = await backend(ollama_upstream.url, http).probe()
    assert not result.healthy
    assert result.reason == reason


async def test_chat_translates_answer_and_usage(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    result = await backend(ollama_upstream.url, http).chat(chat_call(MODEL))
    answer = msgspec.json.decode(result.content)
    assert answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-")
    assert answer["model"] == MODEL
    choice = answer["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello from llama-box"}
    assert choice["finish_reason"] == "stop"
    # The fake counts 2 prompt tokens for "Say hello" and 5 generated pieces.
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert result.usage == Usage(prompt_tokens=2, completion_tokens=5)
    sent = last_chat(ollama_upstream.fake)
    assert sent["model"] == MODEL
    assert sent["stream"] is False
    assert sent["messages"] == [{"role": "user", "content": "Say hello"}]


async def test_chat_maps_sampling_options_and_json_mode(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    call = chat_call(
        MODEL,
        temperature=0.2,
        top_p=0.9,
        max_tokens=3,
        seed=7,
        stop="END",
        response_format={"type": "json_object"},
    )
    result = await backend(ollama_upstream.url, http).chat(call)
    sent = last_chat(ollama_upstream.fake)
    assert sent["options"] == {
        "temperature": 0.2,
        "top_p": 0.9,
        "num_predict": 3,
        "seed": 7,
        "stop": ["END"],
    }
    assert sent["format"] == "json"
    assert "temperature" not in sent
    answer = msgspec.json.decode(result.content)
    assert answer["choices"][0]["finish_reason"] == "length"  # cut by num_predict


async def test_chat_json_schema_becomes_format(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    call = chat_call(
        MODEL,
        stop=["a", "b"],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    result = await backend(ollama_upstream.url, http).chat(call)
    sent = last_chat(ollama_upstream.fake)
    assert sent["format"] == schema
    assert sent["options"] == {"stop": ["a", "b"]}
    content = msgspec.json.decode(result.content)["choices"][0]["message"]["content"]
    assert msgspec.json.decode(content) == {"text": "Hello from llama-box"}


async def test_chat_translates_messages(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    image = "data:image/png;base64," + base64.b64encode(b"png-bytes").decode()
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is"},
                {"type": "image_url", "image_url": {"url": image}},
                {"type": "text", "text": "in this picture?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    call = UpstreamCall(MODEL, raw_body({"model": MODEL, "messages": messages}))
    await backend(ollama_upstream.url, http).chat(call)
    assert last_chat(ollama_upstream.fake)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": "What is\nin this picture?",
            "images": [base64.b64encode(b"png-bytes").decode()],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]


async def test_chat_tool_call_becomes_openai_tool_call(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    call = UpstreamCall(
        MODEL,
        raw_body(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "please call get_weather"}],
                "tools": [WEATHER_TOOL],
            }
        ),
    )
    result = await backend(ollama_upstream.url, http).chat(call)
    assert last_chat(ollama_upstream.fake)["tools"] == [WEATHER_TOOL]
    choice = msgspec.json.decode(result.content)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [tool_call] = choice["message"]["tool_calls"]
    assert tool_call["id"].startswith("call_")
    assert tool_call["type"] == "function"
    assert tool_call["function"]["name"] == "get_weather"
    assert msgspec.json.decode(tool_call["function"]["arguments"]) == {"city": "city-value"}


async def test_chat_without_counts_has_no_usage(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    ollama_upstream.fake.control.report_usage = False
    result = await backend(ollama_upstream.url, http).chat(chat_call(MODEL))
    assert result.usage is None
    assert result.completion_text_chars == len("Hello from llama-box")
    assert "usage" not in msgspec.json.decode(result.content)


@pytest.mark.parametrize("include_usage", [True, False])
async def test_stream_translates_ndjson_to_sse(
    include_usage: bool, ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    call = chat_call(MODEL, stream=True, include_usage=include_usage)
    stream = await backend(ollama_upstream.url, http).chat_stream(call)
    events = sse_events(await collect(stream))
    assert last_chat(ollama_upstream.fake)["stream"] is True
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    assert streamed_text(events) == "Hello from llama-box"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop"
    assert finishes.count("stop") == 1
    usage_chunks = [c for c in chunks if c["choices"] == []]
    if include_usage:
        assert usage_chunks == [
            {
                "id": chunks[0]["id"],
                "object": "chat.completion.chunk",
                "created": chunks[0]["created"],
                "model": MODEL,
                "choices": [],
                "usage": {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7},
            }
        ]
    else:
        assert usage_chunks == []
    assert stream.usage == Usage(prompt_tokens=2, completion_tokens=5)
    assert stream.completion_text_chars == len("Hello from llama-box")


async def test_stream_tool_call(ollama_upstream: Served[FakeOllama], http: UpstreamHttp) -> None:
    body = raw_body(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "get_weather for Paris"}],
            "tools": [WEATHER_TOOL],
            "stream": True,
        }
    )
    stream = await backend(ollama_upstream.url, http).chat_stream(
        UpstreamCall(MODEL, body, stream=True)
    )
    events = sse_events(await collect(stream))
    deltas = [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]
    calls = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
    assert len(calls) == 1
    assert calls[0]["index"] == 0
    assert calls[0]["function"]["name"] == "get_weather"
    assert msgspec.json.decode(calls[0]["function"]["arguments"]) == {"city": "city-value"}
    assert deltas[-1]["finish_reason"] == "tool_calls"


async def test_stream_drop_raises_stream_interrupted(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    ollama_upstream.fake.control.drop_stream_after = 2
    stream = await backend(ollama_upstream.url, http).chat_stream(chat_call(MODEL, stream=True))
    received: list[bytes] = []
    with pytest.raises(StreamInterruptedError):
        await drain_into(stream, received)
    events = sse_events(b"".join(received))
    assert "[DONE]" not in events
    assert streamed_text(events)  # what arrived before the drop was relayed
    await stream.aclose()


async def test_stream_unknown_model_fails_before_streaming(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    with pytest.raises(UpstreamError) as caught:
        await backend(ollama_upstream.url, http).chat_stream(chat_call("missing", stream=True))
    assert caught.value.upstream_status == 404
    assert not caught.value.retryable
    assert "not found" in caught.value.message


async def test_chat_failure_and_hang(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp, short_http: UpstreamHttp
) -> None:
    ollama_upstream.fake.control.fail_status = 500
    ollama_upstream.fake.control.fail_message = "out of memory"
    with pytest.raises(UpstreamError) as failed:
        await backend(ollama_upstream.url, http).chat(chat_call(MODEL))
    assert failed.value.upstream_status == 500
    assert failed.value.retryable
    assert "out of memory" in failed.value.message
    ollama_upstream.fake.control.fail_status = None
    ollama_upstream.fake.control.hang = True
    with pytest.raises(UpstreamError) as hung:
        await backend(ollama_upstream.url, short_http).chat(chat_call(MODEL))
    assert hung.value.upstream_status is None
    assert hung.value.message == "the upstream did not answer within 0.5s"


def embed_call(value: object, **fields: object) -> UpstreamCall:
    body = raw_body({"model": "alias", "input": value, **fields})
    return UpstreamCall("nomic-embed-text:latest", body)


async def test_embeddings_string_and_list(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    adapter = backend(ollama_upstream.url, http)
    single = await adapter.embed(embed_call("hello world!"))
    answer = msgspec.json.decode(single.content)
    assert answer["object"] == "list"
    assert answer["model"] == "nomic-embed-text:latest"
    assert answer["data"] == [
        {"object": "embedding", "index": 0, "embedding": fake_vector("hello world!")}
    ]
    assert answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert single.usage == Usage(prompt_tokens=3)
    many = msgspec.json.decode((await adapter.embed(embed_call(["a", "b", "c"]))).content)
    assert [item["index"] for item in many["data"]] == [0, 1, 2]
    sent = ollama_upstream.fake.requests_for("/api/embed")[-1].body
    assert sent == {"model": "nomic-embed-text:latest", "input": ["a", "b", "c"]}


async def test_embeddings_base64_encoding(
    ollama_upstream: Served[FakeOllama], http: UpstreamHttp
) -> None:
    result = await backend(ollama_upstream.url, http).embed(
        embed_call("xyz", encoding_format="base64")
    )
    encoded = msgspec.json.decode(result.content)["data"][0]["embedding"]
    raw = base64.b64decode(encoded)
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert values == pytest.approx(fake_vector("xyz"), abs=1e-6)


async def test_embeddings_failure(ollama_upstream: Served[FakeOllama], http: UpstreamHttp) -> None:
    with pytest.raises(UpstreamError) as caught:
        await backend(ollama_upstream.url, http).embed(
            UpstreamCall("nope", raw_body({"input": "x"}))
        )
    assert caught.value.upstream_status == 404
