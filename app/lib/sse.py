"""Server-sent events framing shared by the streaming surfaces."""

from __future__ import annotations

from typing import Any

import msgspec

DONE = b"data: [DONE]\n\n"


def error_frame(body: dict[str, Any]) -> bytes:
    """An ``event: error`` frame; OpenAI SDKs raise ``APIError`` on it."""
    return b"event: error\ndata: " + msgspec.json.encode(body) + b"\n\n"
