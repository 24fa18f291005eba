"""Which project a user's own token may charge: its memberships, read briefly cached.

A user token reaches paid calls (``/v1``, JSON-RPC) only on behalf of a project the
user is a member of (owner or member) while the account is enabled. The answer is read
from the database and kept ``ttl`` seconds (``negative_ttl`` for "not a member"), so
a burst of calls costs one query; a removed member, a disabled account or a deleted
project stops being charged to within those seconds on every replica, with no event
to lose. At most ``max_entries`` answers are held, the oldest dropped first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import and_, select

from app.db.models import Project, ProjectMember, User

DEFAULT_TTL_SECONDS = 10.0
DEFAULT_NEGATIVE_TTL_SECONDS = 2.0
MAX_ENTRIES = 20_000
MAX_REFERENCE_CHARS = 64

Loader = Callable[[UUID, str], Awaitable[UUID | None]]


def db_membership_loader(db_config: SQLAlchemyAsyncConfig) -> Loader:
    """The project (by id or slug) ``user_id`` may charge, or None."""

    async def load(user_id: UUID, reference: str) -> UUID | None:
        try:
            as_id: UUID | None = UUID(reference)
        except ValueError:
            as_id = None
        named = Project.slug == reference if as_id is None else Project.id == as_id
        statement = (
            select(Project.id)
            .join(
                ProjectMember,
                and_(ProjectMember.project_id == Project.id, ProjectMember.user_id == user_id),
            )
            .join(User, User.id == ProjectMember.user_id)
            .where(named, User.disabled.is_(False))
        )
        async with db_config.get_session() as session:
            return (await session.execute(statement)).scalar_one_or_none()

    return load


class ProjectMemberships:
    __slots__ = ("_clock", "_entries", "_load", "_max_entries", "_negative_ttl", "_ttl")

    def __init__(
        self,
        load: Loader,
        *,
        ttl: float = DEFAULT_TTL_SECONDS,
        negative_ttl: float = DEFAULT_NEGATIVE_TTL_SECONDS,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[UUID, str], tuple[UUID | None, float]] = OrderedDict()

    async def project_of(self, user_id: UUID, reference: str) -> UUID | None:
        """The id of the project ``reference`` (an id or a slug) names, if ``user_id``
        may charge it; None otherwise (unknown, not a member, account disabled)."""
        reference = reference.strip()
        if not reference or len(reference) > MAX_REFERENCE_CHARS:
            return None
        key = (user_id, reference)
        now = self._clock()
        cached = self._entries.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        project_id = await self._load(user_id, reference)
        ttl = self._ttl if project_id is not None else self._negative_ttl
        self._entries[key] = (project_id, now + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return project_id

    def forget_user(self, user_id: UUID) -> None:
        """Drop this replica's answers for ``user_id`` (its memberships changed here)."""
        for key in [k for k in self._entries if k[0] == user_id]:
            del self._entries[key]
