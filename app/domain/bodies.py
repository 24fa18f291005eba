"""The two bases of every area's JSON bodies, so that all of them spell fields the
same way (camelCase on the wire) and refuse the same mistakes."""

from __future__ import annotations

import msgspec


class Strict(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Base for request bodies: unknown fields are an error, not silently dropped."""


class Camel(msgspec.Struct, rename="camel"):
    """Base for response bodies."""
