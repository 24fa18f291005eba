"""Identifiers minted on the hot path.

``uuid.uuid4`` reads ``os.urandom`` (a system call) for every id; a relayed call mints
two (request id, usage row id). These ids need uniqueness, not secrecy, so they come
from the process's seeded PRNG. Usage-row ids are time-ordered (UUIDv7 layout: 48-bit
milliseconds, then random bits), which also keeps the table's primary-key index
append-mostly. Never use these for secrets or tokens.
"""

from __future__ import annotations

import random
import time
from uuid import UUID

_VERSION_7 = 0x7 << 76
_VARIANT_RFC4122 = 0x2 << 62


def uuid7() -> UUID:
    millis = time.time_ns() // 1_000_000
    value = (millis & 0xFFFF_FFFF_FFFF) << 80
    value |= _VERSION_7 | (random.getrandbits(12) << 64)
    value |= _VARIANT_RFC4122 | random.getrandbits(62)
    return UUID(int=value)


def request_id() -> str:
    """32 hex characters, like ``uuid4().hex``, without the system call."""
    return f"{random.getrandbits(128):032x}"
