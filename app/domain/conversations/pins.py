"""Sticky fallback pins: a conversation whose stream dropped stays on its profile's
fallback until a platform admin clears the pin.

``pin_fallback`` is called by the runtime chat (see ``services``); the first pin of a
conversation wins and later ones are ignored, so two replicas seeing the same drop
(or one drop reported twice) leave exactly one pin. The insert is an
``INSERT ... ON CONFLICT (conversation_id) DO NOTHING``: a concurrent duplicate waits
for the first to commit and then does nothing, it never fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID, uuid4

import structlog
from advanced_alchemy.exceptions import IntegrityError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError as SQLAlchemyIntegrityError

from app.db.models import Conversation, FallbackPin
from app.domain.paging import newest_first
from app.domain.queries import delete_one
from app.lib.clock import utcnow
from app.lib.errors import NotFoundError

PIN_REASONS = frozenset({"upstream_dropped", "client_disconnected"})
logger = structlog.get_logger()


def pin_not_found() -> NotFoundError:
    return NotFoundError("this conversation has no fallback pin", code="pin_not_found")


class FallbackPinService(SQLAlchemyAsyncRepositoryService[FallbackPin]):
    class Repo(SQLAlchemyAsyncRepository[FallbackPin]):
        model_type = FallbackPin

    repository_type = Repo

    async def pin_fallback(
        self,
        conversation_id: UUID,
        project_id: UUID,
        from_profile_id: str,
        to_profile_id: str,
        reason: str,
        backend: str | None,
    ) -> bool:
        """Pin the conversation to ``to_profile_id`` unless it is pinned already.

        Returns whether a new pin was created (False: one existed, or the conversation
        is gone or not the project's; nothing is raised for those, the stream that
        reported the drop has nothing better to do). Commits.
        """
        if reason not in PIN_REASONS:
            raise ValueError(f"unknown pin reason {reason!r}")
        session = self.repository.session
        owner = await session.scalar(
            select(Conversation.project_id).where(Conversation.id == conversation_id)
        )
        if owner != project_id:
            await session.rollback()
            logger.warning(
                "fallback pin skipped: no such conversation in the project",
                conversation_id=str(conversation_id),
                project_id=str(project_id),
            )
            return False
        now = utcnow()
        values = {
            "id": uuid4(),
            "conversation_id": conversation_id,
            "project_id": project_id,
            "from_profile_id": from_profile_id,
            "to_profile_id": to_profile_id,
            "reason": reason,
            "backend": backend,
            "created_at": now,
            "updated_at": now,
        }
        insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
        statement = (
            insert(FallbackPin)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["conversation_id"])
            .returning(FallbackPin.id)
        )
        try:
            created = await session.scalar(statement)
            await session.commit()
        except (IntegrityError, SQLAlchemyIntegrityError):
            # The conversation was deleted between the check and the insert.
            await session.rollback()
            return False
        return created is not None

    async def get_pin(self, conversation_id: UUID) -> FallbackPin | None:
        return await self.get_one_or_none(FallbackPin.conversation_id == conversation_id)

    async def clear_pin(self, conversation_id: UUID) -> bool:
        """Remove the pin; returns whether there was one. Commits."""
        return await delete_one(
            self.repository.session, FallbackPin, FallbackPin.conversation_id == conversation_id
        )

    async def page(self, limit: int, offset: int) -> tuple[Sequence[FallbackPin], int]:
        """Every pin of every project, newest first (the admin view)."""
        return await self.get_many_and_count(*newest_first(limit, offset))
