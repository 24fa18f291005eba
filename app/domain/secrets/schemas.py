"""Bodies of the secrets API (camelCase on the wire, like the rest of the Projects API).

A value goes in and never comes out: no response type here has a field for it.
"""

from __future__ import annotations

import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
MAX_VALUE_BYTES = 16 * 1024
"""A value is at most 16 KiB of UTF-8 (checked in bytes by ``services.check_value``)."""

SecretName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, min_length=1, max_length=100)]
# The character bound is a cheap first cut; the byte bound is checked after decoding.
SecretValue = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_VALUE_BYTES)]
Description = Annotated[str, msgspec.Meta(max_length=500)]


class SecretCreate(Strict):
    name: SecretName
    value: SecretValue
    description: Description = ""

    def __repr__(self) -> str:
        # Keeps the value out of tracebacks and debug output that repr the body.
        return f"SecretCreate(name={self.name!r}, value=<hidden>)"


class SecretValueIn(Strict):
    value: SecretValue

    def __repr__(self) -> str:
        return "SecretValueIn(value=<hidden>)"


class SecretUpdate(Strict):
    description: Description | msgspec.UnsetType = msgspec.UNSET


class SecretUser(Camel):
    """A custom LLM that refers to the secret."""

    id: UUID
    name: str


class SecretOut(Camel):
    id: UUID
    name: str
    description: str
    hint: str
    """The masked last four characters (``••••abcd``); ``••••`` for short values."""
    created_at: datetime.datetime
    rotated_at: datetime.datetime | None
    """When the value was last replaced; null while it is the first one."""
    used_by: list[SecretUser]
