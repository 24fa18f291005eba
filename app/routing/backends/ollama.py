"""Adapter for Ollama's native API (``/api/tags``, ``/api/chat``, ``/api/embed``).

An Ollama backend is built from its URL alone: it takes no API key, and it serves
exactly what it has pulled, so the advertised models are the tags it lists (a static
list in the spec is ignored). Answers are translated to OpenAI's shapes; NDJSON
stream lines become ``chat.completion.chunk`` SSE frames.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import aiohttp
import msgspec

from app.lib.http import UpstreamHttp, UpstreamLimits, frozen_headers
from app.routing.backends.base import Backend, ChatStream
from app.routing.backends.chunks import DONE_FRAME, chunk_frame, completion_id, usage_json
from app.routing.backends.failures import invalid_json, malformed
from app.routing.backends.ollama_translate import (
    OllamaChat,
    OllamaEmbed,
    chat_completion,
    chat_request,
    embed_request,
    embeddings_list,
    finish_reason,
    openai_tool_calls,
    wants_base64,
)
from app.routing.backends.transport import JSON_HEADERS, fetch, open_response, probe_get
from app.routing.backends.upstream_stream import UpstreamChatStream
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.types import (
    BackendSpec,
    Capability,
    ChatResult,
    EmbeddingResult,
    ProbeResult,
    UpstreamCall,
    Usage,
)
from app.routing.urls import plain_endpoint

STREAM_HEADERS = frozen_headers({**JSON_HEADERS, "Accept": "application/x-ndjson"})


class OllamaBackend(Backend):
    kind = "ollama"
    capabilities: frozenset[Capability] = frozenset({"chat", "embeddings"})

    def __init__(self, spec: BackendSpec, http: UpstreamHttp) -> None:
        super().__init__(dataclasses.replace(spec, api_key=None, models=()))
        self._http = http
        self._tags_url = plain_endpoint(spec.url, "/api/tags")
        self._chat_url = plain_endpoint(spec.url, "/api/chat")
        self._embed_url = plain_endpoint(spec.url, "/api/embed")

    async def probe(self) -> ProbeResult:
        outcome = await probe_get(self._http, self._tags_url)
        if isinstance(outcome, str):
            return ProbeResult(False, outcome)
        if not outcome.ok:
            return ProbeResult(False, f"status {outcome.status}")
        return ProbeResult(True, "ok", tag_names(outcome.body))

    async def chat(self, call: UpstreamCall) -> ChatResult:
        body = chat_request(call.model, call.body, stream=False)
        status, content = await fetch(self._http, self._chat_url, body, JSON_HEADERS)
        try:
            answer = msgspec.json.decode(content, type=OllamaChat)
        except msgspec.ValidationError as exc:
            raise malformed(status, f"an answer of the wrong shape ({exc})") from None
        except msgspec.DecodeError as exc:
            raise invalid_json(status) from exc
        if answer.error:
            raise UpstreamError(f"upstream error: {answer.error}", status=status, retryable=True)
        if answer.message is None:
            raise malformed(status, "a chat answer without a message")
        completion = chat_completion(answer, call.model, int(time.time()))
        usage = answer.usage()
        text = answer.message.content if answer.message is not None else None
        chars = len(text or "") if usage is None else 0
        return ChatResult(msgspec.json.encode(completion), usage, completion_text_chars=chars)

    async def chat_stream(self, call: UpstreamCall) -> ChatStream:
        body = chat_request(call.model, call.body, stream=True)
        response = await open_response(
            self._http, "POST", self._chat_url, data=body, headers=STREAM_HEADERS
        )
        return OllamaChatStream(
            response, self._http.limits, model=call.model, include_usage=call.include_usage
        )

    async def embed(self, call: UpstreamCall) -> EmbeddingResult:
        body = embed_request(call.model, call.body)
        status, content = await fetch(self._http, self._embed_url, body, JSON_HEADERS)
        try:
            answer = msgspec.json.decode(content, type=OllamaEmbed)
            out = embeddings_list(answer, call.model, as_base64=wants_base64(call.body))
        except msgspec.ValidationError as exc:
            raise malformed(status, f"an answer of the wrong shape ({exc})") from None
        except msgspec.DecodeError as exc:
            raise invalid_json(status) from exc
        if answer.embeddings is None:
            raise malformed(status, "an embeddings answer without embeddings")
        count = answer.prompt_eval_count
        usage = None if count is None else Usage(prompt_tokens=count)
        return EmbeddingResult(msgspec.json.encode(out), usage)


class OllamaChatStream(UpstreamChatStream):
    """Translates Ollama's NDJSON stream into OpenAI SSE chunks, one network read at a time."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        limits: UpstreamLimits,
        *,
        model: str,
        include_usage: bool,
    ) -> None:
        super().__init__(response, limits)
        self._model = model
        self._include_usage = include_usage
        self._id = completion_id()
        self._created = int(time.time())
        self._started = False
        self._tool_index = 0
        self._ended = False

    def _on_chunk(self, chunk: bytes) -> bytes:
        return self._translate(chunk)

    def _at_end(self) -> bytes:
        out = self._translate(b"\n")
        if not self._ended:
            # Closed without its final ``done`` line: the answer may be cut anywhere.
            raise self.interrupted("the upstream ended the stream before its last line")
        return out

    def line_too_long(self) -> StreamInterruptedError:
        # Ollama's own wording, kept as clients have seen it.
        return self.interrupted(f"the upstream sent a line longer than {self.max_line_bytes} bytes")

    def _translate(self, chunk: bytes) -> bytes:
        frames: list[bytes] = []
        for line in self.whole_lines(chunk).split(b"\n"):
            if self._ended or not line.strip():
                continue
            if len(line) > self.max_line_bytes:
                raise self.line_too_long()
            try:
                answer = msgspec.json.decode(line, type=OllamaChat)
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise self.interrupted("the upstream sent a line that is not JSON") from None
            if answer.error:
                raise self.interrupted(answer.error)
            self._frames(answer, frames)
        return b"".join(frames)

    def _frames(self, answer: OllamaChat, frames: list[bytes]) -> None:
        message = answer.message
        delta: dict[str, Any] = {}
        if not self._started:
            delta = {"role": "assistant", "content": ""}
        if message is not None:
            if message.content:
                delta["content"] = message.content
                self.completion_text_chars += len(message.content)
            if message.thinking:
                delta["reasoning_content"] = message.thinking
            if message.tool_calls:
                delta["tool_calls"] = openai_tool_calls(message.tool_calls, self._tool_index)
                self._tool_index += len(message.tool_calls)
        if delta:
            self._started = True
            frames.append(self._frame([{"index": 0, "delta": delta, "finish_reason": None}]))
        if not answer.done:
            return
        self._ended = True
        self.usage = answer.usage()
        reason = finish_reason(answer, self._tool_index > 0)
        frames.append(self._frame([{"index": 0, "delta": {}, "finish_reason": reason}]))
        if self._include_usage and self.usage is not None:
            frames.append(self._frame([], usage=usage_json(self.usage)))
        frames.append(DONE_FRAME)

    def _frame(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return chunk_frame(self._id, self._model, self._created, choices, **extra)


def tag_names(body: bytes) -> tuple[str, ...]:
    """Model names from ``/api/tags`` (``models[].name``, else ``.model``); junk ignored."""
    try:
        document: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return ()
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list):
        return ()
    names: list[str] = []
    for entry in models:
        if isinstance(entry, dict):
            name = entry.get("name") if isinstance(entry.get("name"), str) else entry.get("model")
            if isinstance(name, str) and name.strip():
                names.append(name.strip())
    return tuple(dict.fromkeys(names))
