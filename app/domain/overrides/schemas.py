"""Bodies of the overrides API (camelCase on the wire, like the rest of the Projects API).

The key is write-only: ``OverrideCreate`` takes it, ``OverrideOut`` never carries it,
only its masked hint (``••••`` and the last four characters).
"""

from __future__ import annotations

import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

MAX_TARGET = 200
MAX_KEY = 8192

ConversationIdIn = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TARGET)]
ModelIdIn = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TARGET)]
ApiKeyIn = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY)]


class OverrideCreate(Strict):
    conversation_id: ConversationIdIn
    """Matched exactly against the ``conversation_id`` of a request."""
    model_id: ModelIdIn
    """A model id prefix: ``qwen-qwq-32b`` also covers ``qwen-qwq-32b-high``."""
    api_key: ApiKeyIn

    def __repr__(self) -> str:
        # Keep the key out of any log line or traceback that formats the body.
        return (
            f"OverrideCreate(conversation_id={self.conversation_id!r}, "
            f"model_id={self.model_id!r}, api_key='<redacted>')"
        )


class OverrideOut(Camel):
    id: UUID
    conversation_id: str
    model_id: str
    key_hint: str
    created_at: datetime.datetime
