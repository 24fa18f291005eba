"""Translation between OpenAI's chat/embeddings shapes and Ollama's native API.

Requests: an OpenAI chat body becomes an ``/api/chat`` body (messages flattened to
text + base64 images, sampling parameters moved into ``options``, ``response_format``
into ``format``). Answers: Ollama's message, tool calls and eval counts become an
OpenAI ``chat.completion`` or ``chat.completion.chunk``.
"""

from __future__ import annotations

import base64
import secrets
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from app.routing.backends.chunks import completion_id, usage_json
from app.routing.types import RawBody, Usage, decode_field, decode_messages

# OpenAI sampling parameter -> Ollama ``options`` key.
OPTION_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "temperature": "temperature",
        "top_p": "top_p",
        "max_tokens": "num_predict",
        "max_completion_tokens": "num_predict",
        "seed": "seed",
        "stop": "stop",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
    }
)
ROLE_NAMES: Mapping[str, str] = MappingProxyType({"developer": "system"})
"""OpenAI roles Ollama does not know, mapped to the closest one it does."""


NO_ARGUMENTS = msgspec.Raw(b"")


class OllamaFunction(msgspec.Struct):
    name: str = ""
    arguments: msgspec.Raw = NO_ARGUMENTS
    """Kept undecoded: it is relayed as JSON text (msgspec cannot put Raw in a union)."""


class OllamaToolCall(msgspec.Struct):
    function: OllamaFunction | None = None


class OllamaMessage(msgspec.Struct):
    content: str | None = None
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None


class OllamaChat(msgspec.Struct):
    """One ``/api/chat`` answer, or one NDJSON line of a stream."""

    message: OllamaMessage | None = None
    done: bool = False
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    error: str | None = None

    def usage(self) -> Usage | None:
        if self.prompt_eval_count is None and self.eval_count is None:
            return None
        return Usage(self.prompt_eval_count or 0, self.eval_count or 0)


class OllamaEmbed(msgspec.Struct):
    embeddings: list[msgspec.Raw] | None = None
    prompt_eval_count: int | None = None


def chat_request(model: str, body: RawBody, *, stream: bool) -> bytes:
    messages = decode_messages(body)
    request: dict[str, Any] = {
        "model": model,
        "messages": ollama_messages(messages),
        "stream": stream,
    }
    if "tools" in body:
        request["tools"] = body["tools"]  # Ollama takes OpenAI's tool shape as is
    options: dict[str, Any] = {}
    for name, option in OPTION_NAMES.items():
        value = decode_field(body, name)
        if value is None:
            continue
        options[option] = [value] if option == "stop" and isinstance(value, str) else value
    if options:
        request["options"] = options
    response_format = decode_field(body, "response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            request["format"] = "json"
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            request["format"] = schema if isinstance(schema, dict) else "json"
    return msgspec.json.encode(request)


def ollama_messages(messages: list[Any]) -> list[dict[str, Any]]:
    tool_names: dict[str, str] = {}
    translated: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "user")
        text, images = _flatten(message.get("content"))
        out: dict[str, Any] = {"role": ROLE_NAMES.get(role, role), "content": text}
        if images:
            out["images"] = images
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            out["tool_calls"] = [_ollama_tool_call(call, tool_names) for call in calls]
        if role == "tool":
            name = tool_names.get(str(message.get("tool_call_id")), message.get("name"))
            if isinstance(name, str):
                out["tool_name"] = name
        translated.append(out)
    return translated


def _flatten(content: Any) -> tuple[str, list[str]]:
    """Text parts joined by newlines, and the base64 payloads of data-URL images."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return "", []
    texts: list[str] = []
    images: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        # Ollama cannot fetch remote images; only inline data URLs carry over.
        if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
            images.append(url.split(",", 1)[1])
    return "\n".join(texts), images


def _ollama_tool_call(call: Any, names: dict[str, str]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return {"function": {"name": "", "arguments": {}}}
    name = str(function.get("name") or "")
    if isinstance(call.get("id"), str):
        names[call["id"]] = name
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            arguments = {}
    return {
        "function": {"name": name, "arguments": arguments if isinstance(arguments, dict) else {}}
    }


def openai_tool_calls(calls: list[OllamaToolCall], first_index: int = 0) -> list[dict[str, Any]]:
    """OpenAI tool calls: generated ids, arguments as a JSON string."""
    out: list[dict[str, Any]] = []
    for offset, call in enumerate(calls):
        function = call.function or OllamaFunction()
        out.append(
            {
                "index": first_index + offset,
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": function.name, "arguments": _arguments_text(function)},
            }
        )
    return out


def _arguments_text(function: OllamaFunction) -> str:
    raw = bytes(function.arguments).strip()
    if raw in (b"", b"null"):
        return "{}"
    if raw.startswith(b'"'):  # already a JSON string: unwrap it
        text: str = msgspec.json.decode(raw, type=str)
        return text
    return raw.decode()


def finish_reason(answer: OllamaChat, saw_tool_calls: bool) -> str:
    if saw_tool_calls:
        return "tool_calls"
    return "length" if answer.done_reason == "length" else "stop"


def chat_completion(answer: OllamaChat, model: str, created: int) -> dict[str, Any]:
    message = answer.message or OllamaMessage()
    calls = message.tool_calls or []
    out: dict[str, Any] = {
        "role": "assistant",
        "content": message.content or (None if calls else ""),
    }
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if calls:
        out["tool_calls"] = [
            {k: v for k, v in call.items() if k != "index"} for call in openai_tool_calls(calls)
        ]
    completion: dict[str, Any] = {
        "id": completion_id(),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": out,
                "logprobs": None,
                "finish_reason": finish_reason(answer, bool(calls)),
            }
        ],
    }
    usage = answer.usage()
    if usage is not None:
        completion["usage"] = usage_json(usage)
    return completion


def embed_request(model: str, body: RawBody) -> bytes:
    request: dict[str, Any] = {"model": model, "input": body.get("input", msgspec.Raw(b'""'))}
    if "dimensions" in body:
        request["dimensions"] = body["dimensions"]
    return msgspec.json.encode(request)


def embeddings_list(answer: OllamaEmbed, model: str, *, as_base64: bool) -> dict[str, Any]:
    data = []
    for index, raw in enumerate(answer.embeddings or ()):
        vector: Any = raw
        if as_base64:
            values = msgspec.json.decode(raw, type=list[float])
            packed = struct.pack(f"<{len(values)}f", *values)
            vector = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vector})
    out: dict[str, Any] = {"object": "list", "data": data, "model": model}
    if answer.prompt_eval_count is not None:
        out["usage"] = {
            "prompt_tokens": answer.prompt_eval_count,
            "total_tokens": answer.prompt_eval_count,
        }
    return out


def wants_base64(body: RawBody) -> bool:
    return bool(decode_field(body, "encoding_format") == "base64")
