"""The conversation side of a runtime chat, on sessions of its own.

A stream outlives the request handler, so the chat cannot use the request's session;
each step opens a short one (load, store the user turn, store the answer, pin), and
no pooled connection is held while tokens flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import FallbackPin
from app.domain.conversations.messages import NewMessage
from app.domain.conversations.pins import FallbackPinService
from app.domain.conversations.services import ConversationService
from app.routing.types import Usage


@dataclass(frozen=True, slots=True)
class ChatHistory:
    conversation_id: UUID
    model_profile_id: str | None
    priority: bool
    messages: list[dict[str, Any]]
    """Stored history in OpenAI's message shape, oldest first."""
    pin: FallbackPin | None


class ConversationStore:
    def __init__(self, db_config: SQLAlchemyAsyncConfig) -> None:
        self._db_config = db_config

    async def load(self, project_id: UUID, conversation_id: UUID) -> ChatHistory:
        async with ConversationService.new(config=self._db_config) as conversations:
            ctx = await conversations.load_for_chat(project_id, conversation_id)
        return ChatHistory(
            conversation_id=ctx.conversation.id,
            model_profile_id=ctx.conversation.model_profile_id,
            priority=ctx.conversation.priority,
            messages=ctx.messages,
            pin=ctx.pin,
        )

    async def append_user_turns(self, conversation_id: UUID, turns: list[NewMessage]) -> None:
        async with ConversationService.new(config=self._db_config) as conversations:
            await conversations.append_user_turns(conversation_id, turns)

    async def append_assistant(
        self,
        conversation_id: UUID,
        *,
        content: str | None,
        tool_calls: list[dict[str, Any]] | None,
        profile_id: str,
        backend: str,
        usage: Usage,
    ) -> None:
        async with ConversationService.new(config=self._db_config) as conversations:
            await conversations.append_assistant(
                conversation_id,
                content=content,
                tool_calls=tool_calls,
                profile_id=profile_id,
                backend=backend,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
            )

    async def pin_fallback(
        self,
        conversation_id: UUID,
        project_id: UUID,
        *,
        from_profile_id: str,
        to_profile_id: str,
        reason: str,
        backend: str | None,
    ) -> bool:
        async with FallbackPinService.new(config=self._db_config) as pins:
            return await pins.pin_fallback(
                conversation_id, project_id, from_profile_id, to_profile_id, reason, backend
            )
