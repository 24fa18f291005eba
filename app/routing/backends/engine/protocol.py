"""The Celestia Engine Protocol (CEP) on the wire, and its translation to OpenAI's shapes.

CEP is JSON-RPC 2.0 over one WebSocket. Everything here is pure: msgspec structs for
what an engine sends, and functions that build what Arona sends (request params,
message content per protocol version) or answers (OpenAI completions and chunks).

Content rules (decided here, documented in the adapter):

- Protocol v1 carries message content as a string, v2+ as a list of parts
  ``{"mime", "encoding", "data"}``. Replies are accepted in either form whatever the
  version; non-text reply parts are dropped (a chat completion carries text).
- OpenAI content parts of type ``text`` are converted (v1: joined by newlines; v2: one
  part each). An image given as a ``data:`` URL goes through as a base64 part when the
  engine speaks v2 and lists ``image`` among its modalities. Every other part (remote
  image URLs, audio, files, or images for an engine that cannot take them) is refused
  with a 400 ``unsupported_content``: dropping it would answer a different question.
- Request fields CEP has no slot for (``top_p``, ``stop``, ``seed``, ``tools`` ...) are
  relayed undecoded in ``extra``; stream switches are Arona's own and never sent.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterable
from typing import Any

import msgspec

from app.lib.errors import BadRequestError
from app.routing.backends.chunks import usage_json
from app.routing.errors import UpstreamError, bounded_text
from app.routing.types import RawBody, Usage, decode_field, decode_messages

JSONRPC = "2.0"
PROTOCOL_VERSIONS = (1, 2)
"""The versions Arona can speak; the engine picks one in its handshake result."""
TEXT_MIME = "text/plain"

CONSUMED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "temperature",
        "max_tokens",
        "max_completion_tokens",
    }
)
"""OpenAI fields with a CEP slot of their own (or Arona's own switches): not in ``extra``."""

NOT_RETRYABLE_CODES = frozenset({-32600, -32602})
"""Invalid request / invalid params: the call is at fault, another engine would refuse
it too. Every other code (internal -32603, the -32000..-32099 server range, method not
found -32601, which another engine may implement) is the engine's trouble: retryable."""

NO_RESULT = msgspec.Raw(b"")


class RpcErrorObject(msgspec.Struct):
    code: int = -32603
    message: str = ""


class Frame(msgspec.Struct):
    """Any JSON-RPC message from the engine: a response, a notification or a request."""

    jsonrpc: str | None = None
    id: int | str | None = None
    method: str | None = None
    params: msgspec.Raw = NO_RESULT
    result: msgspec.Raw = NO_RESULT
    """Kept undecoded: the waiting caller decodes it to the type it expects."""
    error: RpcErrorObject | None = None

    @property
    def is_response(self) -> bool:
        return self.method is None and (bool(self.result) or self.error is not None)

    @property
    def valid(self) -> bool:
        """A JSON-RPC 2.0 message: a call/notification, or a response with an id."""
        if self.jsonrpc != JSONRPC:
            return False
        if self.method is not None:
            return True
        return self.id is not None and self.is_response


class Part(msgspec.Struct):
    mime: str = TEXT_MIME
    encoding: str = "utf-8"
    data: str = ""


Content = str | list[Part]


class EngineUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def to_usage(self) -> Usage | None:
        prompt = self.prompt_tokens if self.prompt_tokens is not None else self.input_tokens
        completion = (
            self.completion_tokens if self.completion_tokens is not None else self.output_tokens
        )
        if prompt is None and completion is None:
            return None  # an empty object is no report at all
        return Usage(prompt or 0, completion or 0)


class EngineCapabilities(msgspec.Struct):
    streaming: bool = True
    """Absent means the engine streams (``Engine.ChatStart`` is part of the protocol)."""
    embeddings: bool = True
    max_context_length: int | None = None
    methods: list[str] | None = None
    modalities: list[str] | None = None


class HandshakeResult(msgspec.Struct):
    ok: bool = False
    error: str | None = None
    protocol_version: int = 1
    capabilities: EngineCapabilities | None = None


class ChatReply(msgspec.Struct):
    model: str = ""
    content: Content = ""
    usage: EngineUsage | None = None


class ChatStartResult(msgspec.Struct):
    ok: bool = False
    error: str | None = None
    stream_id: str | None = None


class ChatChunk(msgspec.Struct):
    stream_id: str
    token: Content | None = None
    is_complete: bool = False
    usage: EngineUsage | None = None


class EmbeddingsReply(msgspec.Struct):
    model: str = ""
    embeddings: list[list[float]] = []
    usage: EngineUsage | None = None


class ModelEntry(msgspec.Struct):
    id: str
    context_length: int | None = None
    embedding: bool = False


class ModelsReply(msgspec.Struct):
    models: list[ModelEntry] = []


# -- requests -----------------------------------------------------------------------


def request_frame(request_id: int, method: str, params: Any) -> bytes:
    return msgspec.json.encode(
        {"jsonrpc": JSONRPC, "id": request_id, "method": method, "params": params}
    )


def notification_frame(method: str, params: Any) -> bytes:
    return msgspec.json.encode({"jsonrpc": JSONRPC, "method": method, "params": params})


def error_frame(request_id: int | str | None, code: int, message: str) -> bytes:
    return msgspec.json.encode(
        {"jsonrpc": JSONRPC, "id": request_id, "error": {"code": code, "message": message}}
    )


def handshake_params(
    token: str | None, version: str, capabilities: dict[str, Any]
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "engine": {"name": "arona", "version": version, "language": "python"},
        "capabilities": capabilities,
    }
    if token:
        params["token"] = token
    return params


def chat_params(
    model: str, body: RawBody, version: int, modalities: Iterable[str] = ()
) -> dict[str, Any]:
    """``Engine.Chat`` / ``Engine.ChatStart`` params (without the stream id)."""
    messages = decode_messages(body)
    params: dict[str, Any] = {
        "model": model,
        "messages": engine_messages(messages, version, frozenset(modalities)),
    }
    temperature = decode_field(body, "temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        params["temperature"] = temperature
    for name in ("max_completion_tokens", "max_tokens"):
        value = decode_field(body, name)
        if isinstance(value, int) and not isinstance(value, bool):
            params["max_tokens"] = value
            break
    extra = {key: value for key, value in body.items() if key not in CONSUMED_FIELDS}
    if extra:
        params["extra"] = extra
    return params


def engine_messages(
    messages: list[Any], version: int, modalities: frozenset[str]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequestError(
                "each message must be an object",
                code="invalid_messages",
                param=f"messages[{index}]",
            )
        parts = _parts(message.get("content"), index, version, modalities)
        content: Content = parts if version >= 2 else "\n".join(p.data for p in parts)
        out.append({"role": str(message.get("role") or "user"), "content": content})
    return out


def _parts(content: Any, index: int, version: int, modalities: frozenset[str]) -> list[Part]:
    if content is None:
        return []  # an assistant turn that only called tools
    if isinstance(content, str):
        return [Part(data=content)]
    if not isinstance(content, list):
        raise _unsupported(index, "content must be a string or an array of parts")
    parts: list[Part] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(Part(data=part["text"]))
            continue
        image = _data_url_image(part) if version >= 2 and "image" in modalities else None
        if image is None:
            raise _unsupported(index, f"a {kind or 'malformed'!s} part cannot be sent")
        parts.append(image)
    return parts


def _data_url_image(part: Any) -> Part | None:
    image = part.get("image_url") if isinstance(part, dict) else None
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        return None
    header, data = url[5:].split(",", 1)
    return Part(
        mime=header.split(";", 1)[0] or "application/octet-stream", encoding="base64", data=data
    )


def _unsupported(index: int, why: str) -> BadRequestError:
    return BadRequestError(
        f"engine backends take text content (and data-URL images where the engine "
        f"supports them): message {index}: {why}",
        code="unsupported_content",
        param=f"messages[{index}].content",
    )


def embeddings_params(model: str, body: RawBody) -> dict[str, Any]:
    value = decode_field(body, "input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not all(isinstance(item, str) for item in inputs):
        # Token-id arrays would need the engine's tokenizer, which CEP does not expose.
        raise BadRequestError(
            "engine backends take 'input' as a string or an array of strings",
            code="invalid_input",
            param="input",
        )
    return {"model": model, "input": inputs}


# -- answers -------------------------------------------------------------------------


def text_of(content: Content | None) -> str:
    """The text of a reply or token: a string, or the text parts of a part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for part in content:
        if not part.mime.startswith("text/"):
            continue
        if part.encoding.lower() == "base64":
            try:
                texts.append(base64.b64decode(part.data).decode("utf-8", errors="replace"))
            except (binascii.Error, ValueError):
                continue
        else:
            texts.append(part.data)
    return "".join(texts)


def rpc_error(error: RpcErrorObject) -> UpstreamError:
    message = bounded_text(error.message.encode()) or "no message"
    retryable = error.code not in NOT_RETRYABLE_CODES
    status = 502 if retryable else 400
    return UpstreamError(
        f"engine error {error.code}: {message}", status=status, retryable=retryable
    )


def chat_completion(
    completion_id: str, model: str, created: int, text: str, usage: Usage | None
) -> dict[str, Any]:
    completion: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
    }
    if usage is not None:
        completion["usage"] = usage_json(usage)
    return completion


def embeddings_list(reply: EmbeddingsReply, model: str, *, as_base64: bool) -> dict[str, Any]:
    data = []
    for index, values in enumerate(reply.embeddings):
        vector: Any = values
        if as_base64:
            packed = struct.pack(f"<{len(values)}f", *values)
            vector = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vector})
    out: dict[str, Any] = {"object": "list", "data": data, "model": model}
    usage = reply.usage.to_usage() if reply.usage is not None else None
    if usage is not None:
        out["usage"] = {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens}
    return out
