"""What the runtime relay learns from the OpenAI chunks it passes on.

The runtime chat stores the assistant turn when its stream completes and always ends
the stream with a usage chunk, so unlike the ``/v1`` relay it reads every event: the
text and tool-call deltas are assembled into one message, a usage chunk from the
upstream is noticed, and the upstream's ``[DONE]`` is held back so the usage chunk
(synthesised when the upstream sent none) can go before it.
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec

from app.lib.sse import DONE
from app.routing.types import Usage

_DONE_LINE = re.compile(rb"data: ?\[DONE\]\r?\n(\r?\n)?")


class _FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int = 0
    id: str | None = None
    type: str | None = None
    function: _FunctionDelta | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _UsageIn(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    id: str = ""
    created: int = 0
    model: str = ""
    choices: list[_Choice] = []
    usage: _UsageIn | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


class Transcript:
    """Feed it every relayed chunk; it returns the bytes to send on."""

    def __init__(self) -> None:
        self._pending = b""
        self._text: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.upstream_usage: Usage | None = None
        self.completion_id = ""
        self.created = 0
        self.model = ""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        self._pending = data[cut:]
        for line in data[:cut].splitlines():
            if line.startswith(b"data:"):
                self._read_event(line[5:].strip())
        if b"[DONE]" in chunk:
            chunk = _DONE_LINE.sub(b"", chunk)
        return chunk

    def _read_event(self, payload: bytes) -> None:
        if not payload.startswith(b"{"):
            return
        try:
            event = _decode_chunk(payload)
        except msgspec.DecodeError:
            return  # relayed as it came; a malformed event just adds nothing here
        if event.id and not self.completion_id:
            self.completion_id, self.created, self.model = event.id, event.created, event.model
        if event.usage is not None:
            self.upstream_usage = Usage(event.usage.prompt_tokens, event.usage.completion_tokens)
        for choice in event.choices:
            if choice.index != 0:
                continue  # the runtime asks for one choice; n > 1 is not stored
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                self._text.append(delta.content)
            for call in delta.tool_calls or ():
                self._merge_tool_call(call)

    def _merge_tool_call(self, delta: _ToolCallDelta) -> None:
        call = self._tool_calls.setdefault(
            delta.index,
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if delta.id:
            call["id"] = delta.id
        if delta.type:
            call["type"] = delta.type
        if delta.function is not None:
            if delta.function.name:
                call["function"]["name"] += delta.function.name
            if delta.function.arguments:
                call["function"]["arguments"] += delta.function.arguments

    @property
    def content(self) -> str | None:
        return "".join(self._text) if self._text or not self._tool_calls else None

    @property
    def tool_calls(self) -> list[dict[str, Any]] | None:
        if not self._tool_calls:
            return None
        return [self._tool_calls[i] for i in sorted(self._tool_calls)]

    def closing_frames(self, usage: Usage, fallback_model: str) -> bytes:
        """The usage chunk (unless the upstream sent one) and ``[DONE]``."""
        if self.upstream_usage is not None:
            return DONE
        chunk = {
            "id": self.completion_id or "chatcmpl-arona",
            "object": "chat.completion.chunk",
            "created": self.created or int(time.time()),
            "model": self.model or fallback_model,
            "choices": [],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            },
        }
        return b"data: " + msgspec.json.encode(chunk) + b"\n\n" + DONE


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _CompletionChoice(msgspec.Struct):
    message: _Message | None = None


class _Completion(msgspec.Struct):
    choices: list[_CompletionChoice] = []


def completion_message(body: bytes) -> tuple[str | None, list[dict[str, Any]] | None]:
    """The assistant message of a non-streamed chat completion (content, tool calls)."""
    try:
        completion = msgspec.json.decode(body, type=_Completion)
    except msgspec.DecodeError:
        return None, None
    if not completion.choices or completion.choices[0].message is None:
        return None, None
    message = completion.choices[0].message
    return message.content, message.tool_calls
