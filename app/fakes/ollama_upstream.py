"""A fake Ollama server (raw ASGI): ``/api/tags``, ``/api/chat`` (NDJSON), ``/api/embed``.

Like real Ollama it refuses models it does not list (404), streams unless told
``"stream": false``, honours ``options.num_predict`` (the reply is cut, "length"), and
answers with a tool call when the request offers tools and the last user message
names one of them. Switches and recording: ``app.fakes.common``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from app.fakes.asgi_io import send_json
from app.fakes.common import FakeRequest, FakeUpstream
from app.fakes.content import (
    count_tokens,
    dimensions_of,
    embedding_inputs,
    fake_vector,
    prompt_tokens,
    split_pieces,
    text_of,
)

NDJSON_CONTENT_TYPE = b"application/x-ndjson"
CREATED_AT = "2024-01-01T00:00:00.000000Z"
DURATION_NS = 1_000_000


class FakeOllama(FakeUpstream):
    def __init__(
        self,
        name: str = "fake-ollama",
        *,
        models: Iterable[str] = ("llama3:latest", "nomic-embed-text:latest"),
        chunks: int = 5,
        content: str | None = None,
    ) -> None:
        super().__init__(name, models, None, chunks=chunks, content=content)
        self.route("GET", "/api/tags", self._tags, listing=True)
        self.route("POST", "/api/chat", self._chat)
        self.route("POST", "/api/embed", self._embed)

    def error_body(self, status: int, message: str) -> bytes:
        return msgspec.json.encode({"error": message})

    async def _pulled(self, request: FakeRequest) -> tuple[dict[str, Any], str] | None:
        """The body and its model when the model is pulled; else None, refused as Ollama
        refuses it (404)."""
        body: dict[str, Any] = request.body if isinstance(request.body, dict) else {}
        model = body.get("model")
        models = self.control.models
        if isinstance(model, str) and (model in models or f"{model}:latest" in models):
            return body, model
        await self.send_error(request, 404, f'model "{model}" not found, try pulling it first')
        return None

    async def _tags(self, request: FakeRequest) -> None:
        self.stats.listings += 1
        entries = [
            {
                "name": model,
                "model": model,
                "modified_at": CREATED_AT,
                "size": 4_661_224_676,
                "digest": hashlib.sha256(model.encode()).hexdigest(),
                "details": {
                    "format": "gguf",
                    "family": "llama",
                    "parameter_size": "8B",
                    "quantization_level": "Q4_0",
                },
            }
            for model in self.control.models
        ]
        await send_json(request.send, 200, {"models": entries})

    async def _chat(self, request: FakeRequest) -> None:
        if (pulled := await self._pulled(request)) is None:
            return
        body, model = pulled
        messages = body.get("messages")
        if not isinstance(messages, list):
            await self.send_error(request, 400, "messages must be an array")
            return
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        reply = self.reply_text()
        if body.get("format") is not None:
            reply = msgspec.json.encode({"text": reply}).decode()
        pieces = split_pieces(reply, self.control.chunks)
        done_reason = "stop"
        limit = options.get("num_predict") if isinstance(options, dict) else None
        if isinstance(limit, int) and 0 <= limit < len(pieces):
            pieces, done_reason = pieces[:limit], "length"
        tool_calls = _tool_calls(body.get("tools"), messages)
        if tool_calls:
            pieces = []
        prompt = prompt_tokens(messages)
        final: dict[str, Any] = {
            "model": model,
            "created_at": CREATED_AT,
            "done": True,
            "done_reason": done_reason,
            "total_duration": DURATION_NS,
            "load_duration": DURATION_NS,
        }
        if self.control.report_usage:
            final.update(
                prompt_eval_count=prompt,
                prompt_eval_duration=DURATION_NS,
                eval_count=max(1, len(pieces)),
                eval_duration=DURATION_NS,
            )
        if body.get("stream", True) is not False:
            self.stats.streams += 1
            lines = _lines(model, pieces, tool_calls, final)
            await self.stream(request, lines, NDJSON_CONTENT_TYPE)
            return
        self.stats.chats += 1
        message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
        if tool_calls:
            message["tool_calls"] = tool_calls
        await send_json(request.send, 200, {**final, "message": message})

    async def _embed(self, request: FakeRequest) -> None:
        if (pulled := await self._pulled(request)) is None:
            return
        body, model = pulled
        inputs = embedding_inputs(body.get("input"))
        if not inputs:
            await self.send_error(request, 400, "input must be a string or an array")
            return
        self.stats.embeddings += 1
        size = dimensions_of(body.get("dimensions"))
        answer: dict[str, Any] = {
            "model": model,
            "embeddings": [fake_vector(text, size) for text in inputs],
            "total_duration": DURATION_NS,
            "load_duration": DURATION_NS,
        }
        if self.control.report_usage:
            answer["prompt_eval_count"] = sum(count_tokens(text) for text in inputs)
        await send_json(request.send, 200, answer)


def _lines(
    model: str, pieces: list[str], tool_calls: list[dict[str, Any]], final: dict[str, Any]
) -> Iterator[bytes]:
    for piece in pieces:
        yield _line(
            {
                "model": model,
                "created_at": CREATED_AT,
                "message": {"role": "assistant", "content": piece},
                "done": False,
            }
        )
    if tool_calls:
        yield _line(
            {
                "model": model,
                "created_at": CREATED_AT,
                "message": {"role": "assistant", "content": "", "tool_calls": tool_calls},
                "done": False,
            }
        )
    yield _line({**final, "message": {"role": "assistant", "content": ""}})


def _line(payload: dict[str, Any]) -> bytes:
    return msgspec.json.encode(payload) + b"\n"


def _tool_calls(tools: Any, messages: list[Any]) -> list[dict[str, Any]]:
    """Call the first offered tool whose name the last user message mentions."""
    if not isinstance(tools, list) or not tools:
        return []
    last_user = next(
        (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None
    )
    if last_user is None:
        return []
    text = text_of(last_user.get("content"))
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue
        name = function.get("name")
        if isinstance(name, str) and name and name in text:
            return [{"function": {"name": name, "arguments": _arguments(function)}}]
    return []


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        return {}
    return {str(key): f"{key}-value" for key in properties}
