"""Read only what routing needs from a ``/v1`` body; relay the rest undecoded.

The body is decoded as ``dict[str, msgspec.Raw]``: top-level keys are split out but
their values (a 100k-token ``messages`` array) stay bytes. Fields routing consumes
(``provider``, ``conversation_id``, ``extra``) are removed before relaying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

from app.lib.errors import BadRequestError
from app.lib.input_checks import check_text_fields, decode_json_document
from app.routing.types import RawBody

T = TypeVar("T")
MAX_NAME_CHARS = 256
Endpoint = Literal["chat", "embeddings"]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


@dataclass(slots=True)
class GatewayRequest:
    model: str
    body: RawBody
    stream: bool = False
    include_usage: bool = False
    provider: str | None = None
    conversation_id: str | None = None


def _decode(fields: RawBody, name: str, kind: type[T], what: str) -> T | None:
    raw = fields.get(name)
    if raw is None:
        return None
    try:
        value = msgspec.json.decode(raw, type=kind | None)
    except msgspec.ValidationError:
        raise BadRequestError(f"`{name}` must be {what}", param=name) from None
    return value


def _name(fields: RawBody, name: str) -> str | None:
    value = _decode(fields, name, str, "a string")
    if value is not None and (not value.strip() or len(value) > MAX_NAME_CHARS):
        raise BadRequestError(f"`{name}` must be 1 to {MAX_NAME_CHARS} characters", param=name)
    if value is not None:
        check_text_fields(((name, value),))
    return value


def _require_array(fields: RawBody, name: str, *, allow_string: bool) -> None:
    raw = fields.get(name)
    if raw is None:
        raise BadRequestError(f"missing required field `{name}`", param=name)
    text = bytes(raw).strip()
    if text.startswith(b"[") and text[1:].strip() != b"]":
        return
    if allow_string and text.startswith(b'"'):
        return
    what = "a string or a non-empty array" if allow_string else "a non-empty array"
    raise BadRequestError(f"`{name}` must be {what}", param=name)


def parse_request(raw: bytes, endpoint: Endpoint) -> GatewayRequest:
    """Split ``raw`` into what routing reads and what is relayed as bytes.

    The whole body is checked first as a JSON document an upstream's parser accepts
    (valid UTF-8, numbers in range, nesting within ``MAX_JSON_DEPTH``): what would
    only fail upstream, as a 502, is a 400 here. Prompt text is relayed as sent; the
    fields Arona stores (``model``, ``conversation_id``, ``provider``) must also be
    storable.
    """
    if not raw.strip():
        raise BadRequestError("request body is empty; send a JSON object", code="invalid_json")
    decode_json_document(raw)
    try:
        fields = msgspec.json.decode(raw, type=RawBody)
    except msgspec.ValidationError:
        raise BadRequestError("request body must be a JSON object", code="invalid_json") from None
    except msgspec.DecodeError as exc:  # checked above; kept for a decoder that differs
        message = f"request body is not valid JSON: {exc}"
        raise BadRequestError(message, code="invalid_json") from None
    model = _name(fields, "model")
    if model is None:
        raise BadRequestError("missing required field `model`", param="model")
    provider = _name(fields, "provider")
    conversation_id = _name(fields, "conversation_id")
    extra = _decode(fields, "extra", dict[str, msgspec.Raw], "an object")
    for consumed in ("provider", "conversation_id", "extra"):
        fields.pop(consumed, None)
    if extra:
        fields.update(extra)
    request = GatewayRequest(
        model=model, body=fields, provider=provider, conversation_id=conversation_id
    )
    if endpoint == "chat":
        _require_array(fields, "messages", allow_string=False)
        request.stream = bool(_decode(fields, "stream", bool, "a boolean"))
        options = _decode(fields, "stream_options", StreamOptions, "an object")
        request.include_usage = request.stream and options is not None and options.include_usage
    else:
        _require_array(fields, "input", allow_string=True)
    return request


@dataclass(frozen=True, slots=True)
class ListedModelOut:
    id: str
    owned_by: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    """Token limits, for a project's custom LLMs (the shared pool does not know them)."""


def model_list(models: list[ListedModelOut]) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for model in models:
        entry: dict[str, Any] = {
            "id": model.id,
            "object": "model",
            "created": 0,
            "owned_by": model.owned_by,
        }
        if model.context_window is not None:
            entry["context_window"] = model.context_window
        if model.max_output_tokens is not None:
            entry["max_output_tokens"] = model.max_output_tokens
        data.append(entry)
    return {"object": "list", "data": data}
