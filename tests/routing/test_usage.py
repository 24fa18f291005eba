"""Usage estimation when an upstream reports none (≈4 characters per token)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from app.routing.usage import (
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_PRIMING_TOKENS,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    estimated_usage,
)
from tests.support.upstreams import raw_body

FRAME = REPLY_PRIMING_TOKENS


def chat(*messages: Mapping[str, object], **extra: object) -> int:
    return estimate_prompt_tokens(raw_body({"model": "m", "messages": list(messages), **extra}))


@pytest.mark.parametrize(("chars", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (401, 101)])
def test_completion_tokens_round_up(chars: int, tokens: int) -> None:
    assert estimate_completion_tokens(chars) == tokens


def test_string_content() -> None:
    assert chat({"role": "user", "content": "x" * 40}) == FRAME + MESSAGE_OVERHEAD_TOKENS + 10
    two = chat({"role": "system", "content": "abc"}, {"role": "user", "content": "abcde"})
    assert two == FRAME + 2 * MESSAGE_OVERHEAD_TOKENS + 1 + 2


def test_text_parts_count_and_images_do_not() -> None:
    content = [
        {"type": "text", "text": "a" * 8},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "Q" * 10_000}},
        {"type": "text", "text": "b" * 4},
    ]
    assert chat({"role": "user", "content": content}) == FRAME + MESSAGE_OVERHEAD_TOKENS + 3


def test_tool_calls_and_empty_content() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "x" * 12}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert chat(message) == FRAME + MESSAGE_OVERHEAD_TOKENS + 3


def test_tools_count_by_their_json_size() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    without = chat({"role": "user", "content": "hi"})
    assert chat({"role": "user", "content": "hi"}, tools=tools) > without


def test_unexpected_messages_fall_back_to_the_frame() -> None:
    assert estimate_prompt_tokens(raw_body({"messages": "nope"})) == FRAME
    assert estimate_prompt_tokens(raw_body({"model": "m"})) == 0


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        ("x" * 9, 3),
        (["abcd", "abcde"], 1 + 2),
        ([1, 2, 3], 3),
        ([[1, 2], [3]], 3),
        ({"bad": True}, 0),
    ],
)
def test_embedding_inputs(value: object, tokens: int) -> None:
    assert estimate_prompt_tokens(raw_body({"model": "e", "input": value})) == tokens


def test_estimated_usage_is_marked() -> None:
    usage = estimated_usage(raw_body({"messages": [{"role": "user", "content": "abcd"}]}), 10)
    assert usage.estimated
    assert usage.prompt_tokens == FRAME + MESSAGE_OVERHEAD_TOKENS + 1
    assert usage.completion_tokens == 3
    assert usage.total_tokens == usage.prompt_tokens + 3
