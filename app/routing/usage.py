"""Token usage estimates for upstreams that report none (no tokenizer downloads).

The heuristic, good to a few tens of percent for English text and code:

- text costs one token per ``CHARS_PER_TOKEN`` (4) characters, rounded up;
- each chat message adds ``MESSAGE_OVERHEAD_TOKENS`` (4) for its role and framing, and
  the reply adds ``REPLY_PRIMING_TOKENS`` (3), as OpenAI's chat format does;
- tool definitions count as their JSON text (not decoded: only their size is needed);
- embedding inputs count their text only; pre-tokenized inputs (integer arrays)
  count one token per integer.

Only ``messages`` (or ``input``) is decoded, into structs that skip everything but
text, so a large image or audio part is never materialized.
"""

from __future__ import annotations

import msgspec

from app.routing.types import RawBody, Usage

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
REPLY_PRIMING_TOKENS = 3


class _Part(msgspec.Struct):
    text: str | None = None


class _Function(msgspec.Struct):
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | list[_Part] | None = None
    tool_calls: list[_ToolCall] | None = None


_Input = str | list[str | int | list[int]]


def tokens_for_chars(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN) if chars > 0 else 0


def estimate_prompt_tokens(body: RawBody) -> int:
    if "messages" in body:
        return _chat_prompt_tokens(body)
    if "input" in body:
        return _input_tokens(body["input"])
    return 0


def estimate_completion_tokens(chars: int) -> int:
    return tokens_for_chars(chars)


def estimated_usage(body: RawBody, completion_chars: int) -> Usage:
    return Usage(
        prompt_tokens=estimate_prompt_tokens(body),
        completion_tokens=estimate_completion_tokens(completion_chars),
        estimated=True,
    )


def _chat_prompt_tokens(body: RawBody) -> int:
    try:
        messages = msgspec.json.decode(body["messages"], type=list[_Message])
    except msgspec.DecodeError:
        messages = []
    tokens = REPLY_PRIMING_TOKENS
    for message in messages:
        tokens += MESSAGE_OVERHEAD_TOKENS + tokens_for_chars(_message_chars(message))
    tools = body.get("tools")
    if tools is not None:
        tokens += tokens_for_chars(len(tools))
    return tokens


def _message_chars(message: _Message) -> int:
    content = message.content
    if isinstance(content, str):
        chars = len(content)
    elif content is not None:
        chars = sum(len(part.text) for part in content if part.text is not None)
    else:
        chars = 0
    for call in message.tool_calls or ():
        if call.function is not None and call.function.arguments is not None:
            chars += len(call.function.arguments)
    return chars


def _input_tokens(raw: msgspec.Raw) -> int:
    try:
        value = msgspec.json.decode(raw, type=_Input)
    except msgspec.DecodeError:
        return 0
    if isinstance(value, str):
        return tokens_for_chars(len(value))
    total = 0
    for item in value:
        if isinstance(item, str):
            total += tokens_for_chars(len(item))
        elif isinstance(item, int):
            total += 1
        else:
            total += len(item)
    return total
