"""The two bases of every area's JSON bodies, so that all of them spell fields the
same way (camelCase on the wire) and refuse the same mistakes, and the field types
several areas' bodies share."""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_TOKENS = 100_000_000
"""Past any model's window, and within the 32-bit columns that store token limits."""

Tokens = Annotated[int, msgspec.Meta(gt=0, le=MAX_TOKENS)]
"""A token limit (context window, input or output) of a model profile or custom LLM."""


class Strict(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Base for request bodies: unknown fields are an error, not silently dropped."""


class Camel(msgspec.Struct, rename="camel"):
    """Base for response bodies."""
