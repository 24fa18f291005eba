"""Conversations and their stored messages, always filtered by project.

Service API for the runtime chat (``POST /api/runtime/chat``)
===========================================================

Open a service on its own session (not the request's: a stream outlives the
handler), for the whole chat or per step::

    from app.domain.conversations.messages import NewMessage, validate_messages
    from app.domain.conversations.pins import FallbackPinService
    from app.domain.conversations.services import ConversationService

    async with ConversationService.new(config=resources.db_config) as conversations:
        ctx = await conversations.load_for_chat(project_id, conversation_id)
        # ctx.conversation: Conversation (detached; model_profile_id, priority, ...)
        # ctx.messages: list[dict] -- OpenAI-shaped history, oldest first, ready to
        #     send upstream ({"role", "content"} + "name" / "tool_calls" /
        #     "tool_call_id" when set)
        # ctx.pin: FallbackPin | None (to_profile_id is where the chat must go)
        await conversations.append_user_turns(conversation_id, turns)
        ...  # stream
        await conversations.append_assistant(
            conversation_id,
            content="...",            # str | list | None (None with tool calls)
            tool_calls=None,          # OpenAI tool_calls list or None
            profile_id="llm",
            backend="vllm-a",
            prompt_tokens=12,
            completion_tokens=34,
        )

- ``load_for_chat(project_id, conversation_id) -> ChatContext``: two queries (the
  conversation joined with its pin, then the history); raises ``NotFoundError``
  ``conversation_not_found`` (404) when missing or another project's. It ends its
  transaction (commit of a read) so no pooled connection is held while a stream runs.
- ``append_user_turns(conversation_id, messages) -> None``: the new turn(s) of a
  request, stored at send time. ``messages`` are ``NewMessage`` objects (from
  ``validate_messages(body.messages)``, which checks the camelCase ``MessageIn``
  structs the chat body reuses) or OpenAI-shaped dicts (snake_case, e.g.
  ``MessageIn.to_openai()``), which are checked here by ``messages_from_openai``.
  Both checks raise ``BadRequestError`` 400s naming the field (``messages[1].content``):
  run ``validate_messages`` while preparing the call, before any upstream byte.
- ``append_assistant(conversation_id, content, tool_calls, profile_id, backend,
  prompt_tokens, completion_tokens) -> None``: the answer, when a stream completes.

Each append is its own transaction and commits. Sequence numbers are handed out by
one ``UPDATE conversations SET message_count = message_count + n ... RETURNING
message_count``: on PostgreSQL that row lock is held until the messages are inserted
and committed, so concurrent appends to one conversation queue up and seq stays
unique and gap-free; on SQLite the UPDATE takes the database write lock first. An
append to a deleted conversation raises ``conversation_not_found``. Do not append on
a session that holds uncommitted work of your own: the append commits it (and on
SQLite a read transaction left open can make the write fail with ``database is
locked``).

Pins (``FallbackPinService`` in ``pins.py``, same pattern, ``.new(config=...)``):
``pin_fallback(conversation_id, project_id, from_profile_id, to_profile_id, reason,
backend) -> bool``, ``get_pin(conversation_id)``, ``clear_pin(conversation_id)``,
``page(limit, offset)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID, uuid4

import msgspec
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import Select, func, select, update

from app.db.models import Conversation, ConversationMessage, FallbackPin
from app.domain.conversations.messages import NewMessage, messages_from_openai, stored_message
from app.domain.conversations.schemas import openai_message
from app.domain.conversations.selection import ProfileChoice
from app.domain.queries import delete_in_project
from app.lib.clock import utcnow
from app.lib.errors import BadRequestError, NotFoundError

ConversationRow = tuple[Conversation, FallbackPin | None]


def conversation_not_found() -> NotFoundError:
    return NotFoundError("conversation not found", code="conversation_not_found")


@dataclass(frozen=True, slots=True)
class ChatContext:
    """What the runtime chat needs to continue a conversation."""

    conversation: Conversation
    messages: list[dict[str, Any]]
    """The stored history, oldest first, in OpenAI's message shape."""
    pin: FallbackPin | None
    """The sticky fallback, if a dropped stream moved this conversation."""


def _with_pin() -> Select[Conversation, FallbackPin]:
    return select(Conversation, FallbackPin).outerjoin(
        FallbackPin, FallbackPin.conversation_id == Conversation.id
    )


class ConversationService(SQLAlchemyAsyncRepositoryService[Conversation]):
    class Repo(SQLAlchemyAsyncRepository[Conversation]):
        model_type = Conversation

    repository_type = Repo

    # ------------------------------------------------------------- the REST API

    async def create_conversation(
        self,
        project_id: UUID,
        *,
        title: str,
        profile_id: str | None,
        priority: bool,
        messages: Sequence[NewMessage] = (),
    ) -> Conversation:
        session = self.repository.session
        conversation = Conversation(
            id=uuid4(),
            project_id=project_id,
            title=title.strip(),
            model_profile_id=profile_id,
            priority=priority,
            message_count=len(messages),
        )
        try:
            session.add(conversation)
            # No ORM relationship: insert the parent before its messages.
            await session.flush()
            session.add_all(
                [stored_message(conversation.id, i, m) for i, m in enumerate(messages, 1)]
            )
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
        return conversation

    async def page(
        self, project_id: UUID, limit: int, offset: int, *, priority: bool | None = None
    ) -> tuple[list[ConversationRow], int]:
        """Newest first, each with its pin."""
        session = self.repository.session
        where = [Conversation.project_id == project_id]
        if priority is not None:
            where.append(Conversation.priority == priority)
        total = await session.scalar(select(func.count()).select_from(Conversation).where(*where))
        result = await session.execute(
            _with_pin()
            .where(*where)
            .order_by(Conversation.created_at.desc(), Conversation.id.desc())
            .limit(limit)
            .offset(offset)
        )
        return [(c, p) for c, p in result], int(total or 0)

    async def require(self, project_id: UUID, conversation_id: UUID) -> ConversationRow:
        """The project's conversation and its pin; another project's is a 404."""
        row = (
            await self.repository.session.execute(
                _with_pin().where(
                    Conversation.id == conversation_id, Conversation.project_id == project_id
                )
            )
        ).first()
        if row is None:
            raise conversation_not_found()
        return row[0], row[1]

    async def message_page(
        self, project_id: UUID, conversation_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[ConversationMessage], int]:
        """Oldest first."""
        session = self.repository.session
        count = await session.scalar(
            select(Conversation.message_count).where(
                Conversation.id == conversation_id, Conversation.project_id == project_id
            )
        )
        if count is None:
            raise conversation_not_found()
        rows = await session.scalars(
            select(ConversationMessage)
            .where(ConversationMessage.conversation_id == conversation_id)
            .order_by(ConversationMessage.seq)
            .limit(limit)
            .offset(offset)
        )
        return rows.all(), count

    async def update_conversation(
        self,
        project_id: UUID,
        conversation_id: UUID,
        *,
        title: str | msgspec.UnsetType,
        profile: ProfileChoice,
        priority: bool | msgspec.UnsetType,
    ) -> ConversationRow:
        conversation, pin = await self.require(project_id, conversation_id)
        if not isinstance(title, msgspec.UnsetType):
            conversation.title = title.strip()
        if profile.given:
            conversation.model_profile_id = profile.profile_id
        if not isinstance(priority, msgspec.UnsetType):
            conversation.priority = priority
        await self.repository.session.commit()
        return conversation, pin

    async def fork(
        self,
        project_id: UUID,
        conversation_id: UUID,
        *,
        up_to_message_id: UUID | None,
        title: str | msgspec.UnsetType,
        profile: ProfileChoice,
        priority: bool | msgspec.UnsetType,
    ) -> Conversation:
        """A new conversation with a copy of the history (up to and including
        ``up_to_message_id``). The source's fallback pin is not copied: the pin records
        that *that* conversation's stream dropped and an admin has not cleared it; the
        fork is a new conversation and starts on its own profile (an admin clearing
        the source's pin would otherwise leave an orphan pin behind)."""
        session = self.repository.session
        source, _ = await self.require(project_id, conversation_id)
        history = select(ConversationMessage).where(
            ConversationMessage.conversation_id == source.id
        )
        if up_to_message_id is not None:
            last_seq = await session.scalar(
                select(ConversationMessage.seq).where(
                    ConversationMessage.id == up_to_message_id,
                    ConversationMessage.conversation_id == source.id,
                )
            )
            if last_seq is None:
                raise BadRequestError(
                    "upToMessageId is not a message of this conversation",
                    code="message_not_in_conversation",
                    param="upToMessageId",
                )
            history = history.where(ConversationMessage.seq <= last_seq)
        rows = (await session.scalars(history.order_by(ConversationMessage.seq))).all()
        fork = Conversation(
            id=uuid4(),
            project_id=project_id,
            title=source.title if isinstance(title, msgspec.UnsetType) else title.strip(),
            model_profile_id=profile.profile_id if profile.given else source.model_profile_id,
            priority=source.priority if isinstance(priority, msgspec.UnsetType) else priority,
            forked_from_id=source.id,
            message_count=len(rows),
        )
        try:
            session.add(fork)
            await session.flush()
            session.add_all(
                [
                    stored_message(
                        fork.id,
                        seq,
                        m,
                        model_profile_id=m.model_profile_id,
                        backend=m.backend,
                        prompt_tokens=m.prompt_tokens,
                        completion_tokens=m.completion_tokens,
                        created_at=m.created_at,
                    )
                    for seq, m in enumerate(rows, 1)
                ]
            )
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
        return fork

    async def delete_conversation(self, project_id: UUID, conversation_id: UUID) -> None:
        """Its messages and pin go with it (ON DELETE CASCADE)."""
        session = self.repository.session
        if not await delete_in_project(session, Conversation, project_id, conversation_id):
            raise conversation_not_found()

    # --------------------------------------------------------- the runtime chat

    async def load_for_chat(self, project_id: UUID, conversation_id: UUID) -> ChatContext:
        session = self.repository.session
        conversation, pin = await self.require(project_id, conversation_id)
        rows = await session.execute(
            select(
                ConversationMessage.role,
                ConversationMessage.content,
                ConversationMessage.name,
                ConversationMessage.tool_calls,
                ConversationMessage.tool_call_id,
            )
            .where(ConversationMessage.conversation_id == conversation_id)
            .order_by(ConversationMessage.seq)
        )
        messages = [openai_message(*row) for row in rows]
        # End the read transaction (hands the connection back to the pool) and detach
        # the rows, so a later rollback on this session cannot expire them.
        await session.commit()
        session.expunge(conversation)
        if pin is not None:
            session.expunge(pin)
        return ChatContext(conversation=conversation, messages=messages, pin=pin)

    async def append_user_turns(
        self, conversation_id: UUID, messages: Sequence[NewMessage | Mapping[str, Any]]
    ) -> None:
        """``NewMessage`` objects as they are, or OpenAI dicts (checked here: a 400)."""
        checked = [m for m in messages if isinstance(m, NewMessage)]
        if len(checked) != len(messages):
            # A mix is refused by the check (a NewMessage is not a mapping).
            checked = messages_from_openai(cast(Sequence[Mapping[str, Any]], messages))
        await self._append(conversation_id, checked)

    async def append_assistant(
        self,
        conversation_id: UUID,
        content: str | list[Any] | None,
        tool_calls: list[Any] | None,
        profile_id: str | None,
        backend: str | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        message = NewMessage(role="assistant", content=content, tool_calls=tool_calls or None)
        await self._append(
            conversation_id,
            [message],
            model_profile_id=profile_id,
            backend=backend,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    async def _append(
        self, conversation_id: UUID, messages: Sequence[NewMessage], **extra: Any
    ) -> None:
        if not messages:
            return
        session = self.repository.session
        try:
            # One statement reserves the seq range and locks the row until commit.
            last = await session.scalar(
                update(Conversation)
                .where(Conversation.id == conversation_id)
                .values(
                    message_count=Conversation.message_count + len(messages),
                    updated_at=utcnow(),
                )
                .returning(Conversation.message_count)
            )
            if last is None:
                raise conversation_not_found()
            first = last - len(messages) + 1
            session.add_all(
                [
                    stored_message(conversation_id, seq, m, **extra)
                    for seq, m in enumerate(messages, first)
                ]
            )
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
