"""Bodies of the conversations API (camelCase on the wire, runtime and Projects API alike).

The profile of a conversation may be named by any of three fields with one meaning:
``modelProfileId`` and its aliases ``llmId`` and ``provider`` (see ``selection``).
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

Title = Annotated[str, msgspec.Meta(max_length=200)]
ProfileId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
MessageName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
ToolCallId = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
MAX_MESSAGES = 10_000
"""Most messages one request may carry (a seeded history, a turn): the body bound
alone would let a few bytes each become hundreds of thousands of rows."""
# A string, OpenAI content parts (checked in ``messages``) or null.
Content = str | list[Any] | None


class MessageIn(Strict):
    """One message as a client sends it; ``messages.validate_messages`` checks the rules
    a schema cannot express (content required unless an assistant tool call, ...)."""

    role: str
    content: Content = None
    name: MessageName | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: ToolCallId | None = None

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's shape (snake_case keys). Not a check: run ``validate_messages``
        on the list first for the 400s naming the field."""
        return openai_message(
            self.role, self.content, self.name, self.tool_calls, self.tool_call_id
        )


class ConversationCreate(Strict):
    title: Title = ""
    model_profile_id: ProfileId | None = None
    llm_id: ProfileId | None = None
    provider: ProfileId | None = None
    priority: bool = False
    messages: Annotated[list[MessageIn], msgspec.Meta(max_length=MAX_MESSAGES)] = []
    """History to seed the conversation with, oldest first."""


class ConversationUpdate(Strict):
    title: Title | msgspec.UnsetType = msgspec.UNSET
    # null clears the selection: the project's default applies at chat time.
    model_profile_id: ProfileId | msgspec.UnsetType | None = msgspec.UNSET
    llm_id: ProfileId | msgspec.UnsetType | None = msgspec.UNSET
    provider: ProfileId | msgspec.UnsetType | None = msgspec.UNSET
    priority: bool | msgspec.UnsetType = msgspec.UNSET


class ConversationFork(Strict):
    up_to_message_id: UUID | None = None
    """Copy the history up to and including this message (default: all of it)."""
    title: Title | msgspec.UnsetType = msgspec.UNSET
    model_profile_id: ProfileId | None = None
    llm_id: ProfileId | None = None
    provider: ProfileId | None = None
    priority: bool | msgspec.UnsetType = msgspec.UNSET


class PinSummary(Camel):
    from_profile_id: str
    to_profile_id: str
    reason: str
    backend: str | None
    created_at: datetime.datetime


class ConversationOut(Camel):
    id: UUID
    project_id: UUID
    title: str
    model_profile_id: str | None
    priority: bool
    forked_from_id: UUID | None
    message_count: int
    fallback_pin: PinSummary | None
    created_at: datetime.datetime
    updated_at: datetime.datetime


class MessageOut(Camel):
    id: UUID
    seq: int
    role: str
    content: Any
    name: str | None
    tool_calls: list[Any] | None
    tool_call_id: str | None
    model_profile_id: str | None
    backend: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    created_at: datetime.datetime


class PinOut(Camel):
    conversation_id: UUID
    project_id: UUID
    from_profile_id: str
    to_profile_id: str
    reason: str
    backend: str | None
    created_at: datetime.datetime


def openai_message(
    role: str,
    content: Any,
    name: str | None,
    tool_calls: list[Any] | None,
    tool_call_id: str | None,
) -> dict[str, Any]:
    """A stored message as OpenAI expects it upstream (absent fields left out)."""
    out: dict[str, Any] = {"role": role, "content": content}
    if name:
        out["name"] = name
    if tool_calls:
        out["tool_calls"] = tool_calls
    if tool_call_id:
        out["tool_call_id"] = tool_call_id
    return out
