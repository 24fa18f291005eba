"""A fake OpenAI-compatible server (raw ASGI) for tests, ``arona demo`` and benchmarks.

It answers root-style paths (``/v1/models``, ``/v1/chat/completions``,
``/v1/embeddings``) and, when built with a ``prefix``, the same endpoints path-style
under it (``prefix="/api/paas/v4"`` serves ``/api/paas/v4/chat/completions``).
Replies are deterministic: the text is ``control.content`` or "Hello from <name>", so
a test can tell which backend served it. Switches and recording: ``app.fakes.common``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from app.fakes.asgi_io import send_json
from app.fakes.common import FakeRequest, FakeUpstream
from app.fakes.content import (
    base64_vector,
    count_tokens,
    dimensions_of,
    embedding_inputs,
    fake_vector,
    prompt_tokens,
    split_pieces,
)

DONE_FRAME = b"data: [DONE]\n\n"
SSE_CONTENT_TYPE = b"text/event-stream"


class FakeOpenAI(FakeUpstream):
    def __init__(
        self,
        name: str = "fake-openai",
        *,
        models: Iterable[str] = ("gpt-4o-mini", "text-embedding-3-small"),
        prefix: str = "",
        api_key: str | None = None,
        chunks: int = 5,
        content: str | None = None,
    ) -> None:
        super().__init__(name, models, api_key, chunks=chunks, content=content)
        self.prefix = prefix.rstrip("/")
        self._completion_id = 0
        bases = ["/v1"] + ([self.prefix] if self.prefix else [])
        for base in bases:
            self.route("GET", f"{base}/models", self._models, listing=True)
            self.route("POST", f"{base}/chat/completions", self._chat)
            self.route("POST", f"{base}/embeddings", self._embeddings)

    def error_body(self, status: int, message: str) -> bytes:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        code = {401: "invalid_api_key", 404: "not_found", 429: "rate_limit_exceeded"}.get(status)
        return msgspec.json.encode(
            {"error": {"message": message, "type": kind, "param": None, "code": code}}
        )

    async def _models(self, request: FakeRequest) -> None:
        self.stats.listings += 1
        created = int(time.time())
        data = [
            {"id": model, "object": "model", "created": created, "owned_by": self.name}
            for model in self.control.models
        ]
        await send_json(request.send, 200, {"object": "list", "data": data})

    async def _chat(self, request: FakeRequest) -> None:
        body: dict[str, Any] = request.body if isinstance(request.body, dict) else {}
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            await self.send_error(request, 400, "'messages' must be a non-empty array")
            return
        if self.control.reject_stream_options and "stream_options" in body:
            await self.send_error(request, 400, "Unrecognized request argument: stream_options")
            return
        self._completion_id += 1
        completion_id = f"chatcmpl-fake-{self._completion_id}"
        model = str(body.get("model", ""))
        pieces = split_pieces(self.reply_text(), self.control.chunks)
        prompt = prompt_tokens(messages)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": len(pieces),
            "total_tokens": prompt + len(pieces),
        }
        if self.control.cached_tokens:
            cached = min(self.control.cached_tokens, prompt)
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if body.get("stream") is True:
            self.stats.streams += 1
            options = body.get("stream_options")
            wants_usage = isinstance(options, dict) and options.get("include_usage") is True
            frames = self._frames(
                completion_id,
                model,
                pieces,
                usage if self.control.report_usage else None,
                include_usage=wants_usage,
            )
            await self.stream(request, frames, SSE_CONTENT_TYPE)
            return
        self.stats.chats += 1
        answer: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(pieces)},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
        }
        if self.control.report_usage:
            answer["usage"] = usage
        await send_json(request.send, 200, answer)

    def _frames(
        self,
        completion_id: str,
        model: str,
        pieces: list[str],
        usage: dict[str, Any] | None,
        *,
        include_usage: bool,
    ) -> Iterator[bytes]:
        created = int(time.time())

        def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            chunk: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
            }
            # Like OpenAI: with include_usage every chunk carries "usage" (null until the end).
            if include_usage and usage is not None:
                chunk["usage"] = None
            chunk.update(extra)
            return b"data: " + msgspec.json.encode(chunk) + b"\n\n"

        def choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

        yield frame(choice({"role": "assistant", "content": ""}))
        for piece in pieces:
            yield frame(choice({"content": piece}))
        yield frame(choice({}, "stop"))
        if include_usage and usage is not None:
            yield frame([], usage=usage)
        yield DONE_FRAME

    async def _embeddings(self, request: FakeRequest) -> None:
        body: dict[str, Any] = request.body if isinstance(request.body, dict) else {}
        inputs = embedding_inputs(body.get("input"))
        if not inputs:
            await self.send_error(request, 400, "'input' must be a string or an array")
            return
        self.stats.embeddings += 1
        size = dimensions_of(body.get("dimensions"))
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector = fake_vector(text, size)
            data.append(
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": base64_vector(vector) if as_base64 else vector,
                }
            )
        answer: dict[str, Any] = {"object": "list", "data": data, "model": body.get("model")}
        if self.control.report_usage:
            tokens = sum(count_tokens(text) for text in inputs)
            answer["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        await send_json(request.send, 200, answer)
