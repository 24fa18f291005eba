"""Deterministic content of the fakes: reply pieces, token counts, embedding vectors."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

EMBEDDING_DIMENSIONS = 8


def split_pieces(text: str, count: int) -> list[str]:
    """``count`` non-empty slices of ``text``, repeating it when it is too short."""
    if count <= 0:
        return []
    text = text or "ok"
    while len(text) < count:
        text = f"{text} {text}"
    size = len(text)
    return [text[size * i // count : size * (i + 1) // count] for i in range(count)]


def text_of(content: Any) -> str:
    """The text of an OpenAI message content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def count_tokens(text: str) -> int:
    """The fakes' deterministic token count: one per four characters, at least one."""
    return max(1, len(text) // 4)


def prompt_tokens(messages: list[Any]) -> int:
    """The fakes' prompt count of a chat's ``messages`` (the same whichever API the
    fake speaks, so a test can compare what two kinds of backend metered)."""
    return sum(count_tokens(text_of(m.get("content"))) for m in messages if isinstance(m, dict))


def fake_vector(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """A deterministic unit-range vector derived from the text's hash."""
    digest = b""
    counter = 0
    while len(digest) < dimensions:
        digest += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    return [round(byte / 127.5 - 1.0, 6) for byte in digest[:dimensions]]


def base64_vector(vector: list[float]) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32 values."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embedding_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item if isinstance(item, str) else str(item) for item in value]
    return []


def dimensions_of(value: Any) -> int:
    """The requested vector size (OpenAI's ``dimensions``), else the default."""
    return value if isinstance(value, int) and value > 0 else EMBEDDING_DIMENSIONS
