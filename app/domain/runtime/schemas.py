"""Bodies of the runtime API (camelCase on the wire)."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

import msgspec

from app.domain.bodies import Strict
from app.domain.conversations.schemas import MAX_MESSAGES, MessageIn, ProfileId

MAX_TOOLS = 128


class RuntimeChatRequest(Strict):
    conversation_id: UUID
    messages: Annotated[list[MessageIn], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    """The new turn(s); the stored history is sent upstream before them."""
    model_profile_id: ProfileId | None = None
    llm_id: ProfileId | None = None
    provider: ProfileId | None = None
    tools: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    stream: bool = True
