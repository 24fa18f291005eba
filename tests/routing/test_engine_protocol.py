"""CEP translation rules: request params, content per protocol version, answers, errors."""

from __future__ import annotations

import base64
import struct

import msgspec
import pytest

from app.lib.errors import BadRequestError
from app.routing.backends.engine.protocol import (
    EmbeddingsReply,
    EngineUsage,
    Frame,
    Part,
    RpcErrorObject,
    chat_params,
    embeddings_list,
    embeddings_params,
    rpc_error,
    text_of,
)
from app.routing.types import Usage
from tests.support.upstreams import raw_body

TEXT_PARTS = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


def encoded(params: dict[str, object]) -> object:
    """What goes on the wire (``extra`` values are relayed undecoded)."""
    return msgspec.json.decode(msgspec.json.encode(params))


def test_fields_without_a_slot_go_into_extra_and_switches_are_dropped() -> None:
    body = raw_body(
        {
            "model": "client-name",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.25,
            "max_completion_tokens": 64,
            "max_tokens": 9,
            "top_p": 0.5,
            "stop": ["\n"],
            "seed": 7,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    params = encoded(chat_params("served", body, 1))
    assert params == {
        "model": "served",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.25,
        "max_tokens": 64,  # max_completion_tokens wins over the deprecated max_tokens
        "extra": {
            "top_p": 0.5,
            "stop": ["\n"],
            "seed": 7,
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
    }


def test_no_extra_when_every_field_has_a_slot() -> None:
    body = raw_body({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    params = encoded(chat_params("m", body, 2))
    assert params == {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [{"mime": "text/plain", "encoding": "utf-8", "data": "hi"}],
            }
        ],
        "max_tokens": 3,
    }


def test_text_parts_are_joined_for_v1_and_kept_apart_for_v2() -> None:
    body = raw_body({"messages": [{"role": "user", "content": TEXT_PARTS}, {"role": "assistant"}]})
    v1 = encoded(chat_params("m", body, 1))
    assert v1["messages"] == [  # type: ignore[index]
        {"role": "user", "content": "first\nsecond"},
        {"role": "assistant", "content": ""},
    ]
    v2 = encoded(chat_params("m", body, 2))
    assert v2["messages"] == [  # type: ignore[index]
        {
            "role": "user",
            "content": [
                {"mime": "text/plain", "encoding": "utf-8", "data": "first"},
                {"mime": "text/plain", "encoding": "utf-8", "data": "second"},
            ],
        },
        {"role": "assistant", "content": []},
    ]


def test_a_data_url_image_goes_to_a_v2_engine_that_takes_images() -> None:
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    body = raw_body({"messages": [{"role": "user", "content": [TEXT_PARTS[0], image]}]})
    params = encoded(chat_params("m", body, 2, ["text", "image"]))
    assert params["messages"][0]["content"][1] == {  # type: ignore[index]
        "mime": "image/png",
        "encoding": "base64",
        "data": "iVBORw0KGgo=",
    }


@pytest.mark.parametrize(
    ("part", "version", "modalities"),
    [
        ({"type": "image_url", "image_url": {"url": PNG_URL}}, 2, ["text"]),
        ({"type": "image_url", "image_url": {"url": PNG_URL}}, 1, ["text", "image"]),
        ({"type": "image_url", "image_url": {"url": "https://x/cat.png"}}, 2, ["image"]),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, 2, []),
        ("not a part", 2, []),
    ],
)
def test_parts_the_engine_cannot_take_are_refused_with_a_400(
    part: object, version: int, modalities: list[str]
) -> None:
    body = raw_body(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [part]}]}
    )
    with pytest.raises(BadRequestError) as caught:
        chat_params("m", body, version, modalities)
    assert caught.value.code == "unsupported_content"
    assert caught.value.param == "messages[1].content"
    assert "message 1" in caught.value.message


@pytest.mark.parametrize("messages", [None, "hi", [1]])
def test_malformed_messages_are_a_400(messages: object) -> None:
    body = raw_body({"messages": messages} if messages is not None else {})
    with pytest.raises(BadRequestError) as caught:
        chat_params("m", body, 1)
    assert caught.value.code == "invalid_messages"


def test_embedding_input_must_be_text() -> None:
    assert embeddings_params("e", raw_body({"input": "one"})) == {"model": "e", "input": ["one"]}
    assert embeddings_params("e", raw_body({"input": ["a", "b"], "dimensions": 4})) == {
        "model": "e",
        "input": ["a", "b"],
    }
    for bad in ([1, 2, 3], [[1, 2]], None):
        with pytest.raises(BadRequestError) as caught:
            embeddings_params("e", raw_body({"input": bad}))
        assert (caught.value.code, caught.value.param) == ("invalid_input", "input")


def test_reply_text_accepts_strings_and_parts() -> None:
    assert text_of("plain") == "plain"
    assert text_of(None) == ""
    encoded_text = base64.b64encode("héllo".encode()).decode()
    parts = [
        Part(data="a"),
        Part(mime="image/png", encoding="base64", data="AAAA"),  # not text: dropped
        Part(mime="text/markdown", encoding="base64", data=encoded_text),
        Part(mime="text/plain", encoding="base64", data="%%%"),  # undecodable: dropped
    ]
    assert text_of(parts) == "ahéllo"


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (EngineUsage(prompt_tokens=3, completion_tokens=4), Usage(3, 4)),
        (EngineUsage(input_tokens=5, output_tokens=6), Usage(5, 6)),
        (EngineUsage(prompt_tokens=2), Usage(2, 0)),
        (EngineUsage(), None),
    ],
)
def test_usage_names_are_tolerated(usage: EngineUsage, expected: Usage | None) -> None:
    assert usage.to_usage() == expected


@pytest.mark.parametrize(
    ("code", "retryable", "status"),
    [
        (-32602, False, 400),
        (-32600, False, 400),
        (-32603, True, 502),
        (-32000, True, 502),
        (-32601, True, 502),
        (42, True, 502),
    ],
)
def test_json_rpc_errors_keep_the_engine_message(code: int, retryable: bool, status: int) -> None:
    error = rpc_error(RpcErrorObject(code=code, message="the engine says no"))
    assert error.message == f"engine error {code}: the engine says no"
    assert (error.retryable, error.upstream_status) == (retryable, status)


@pytest.mark.parametrize(
    ("raw", "valid"),
    [
        (b'{"jsonrpc":"2.0","id":3,"result":{"ok":true}}', True),
        (b'{"jsonrpc":"2.0","id":3,"result":null}', True),
        (b'{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"x"}}', True),
        (b'{"jsonrpc":"2.0","method":"Engine.ChatChunk","params":{}}', True),
        (b'{"jsonrpc":"1.0","id":3,"result":{}}', False),
        (b'{"id":3,"result":{}}', False),
        (b'{"jsonrpc":"2.0","id":3}', False),
        (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}', False),
        (b'{"hello":"world"}', False),
    ],
)
def test_what_counts_as_json_rpc(raw: bytes, valid: bool) -> None:
    assert msgspec.json.decode(raw, type=Frame).valid is valid


def test_embeddings_as_floats_or_base64() -> None:
    reply = EmbeddingsReply(
        model="e", embeddings=[[0.5, -1.0], [0.25, 2.0]], usage=EngineUsage(input_tokens=3)
    )
    floats = embeddings_list(reply, "served", as_base64=False)
    assert floats["data"][1] == {"object": "embedding", "index": 1, "embedding": [0.25, 2.0]}
    assert floats["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert floats["model"] == "served"
    packed = embeddings_list(reply, "served", as_base64=True)["data"][0]["embedding"]
    assert struct.unpack("<2f", base64.b64decode(packed)) == (0.5, -1.0)
    assert "usage" not in embeddings_list(EmbeddingsReply(), "e", as_base64=False)
