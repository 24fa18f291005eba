"""OpenAI's chat-completion pieces, as the translating adapters build them.

Ollama (NDJSON) and CEP engines (JSON-RPC) answer in their own shapes; both adapters
turn those into the same OpenAI ids, usage objects and ``chat.completion.chunk`` SSE
frames, so the builders live here once and a client sees one format whichever
translating backend served it. (OpenAI-compatible upstreams are relayed as sent.)
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from app.routing.types import Usage

DONE_FRAME = b"data: [DONE]\n\n"


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def chunk_frame(
    completion_id: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any
) -> bytes:
    """One ``chat.completion.chunk`` as an SSE ``data:`` frame; ``extra`` adds fields
    beside ``choices`` (``usage`` on the last chunk)."""
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"
