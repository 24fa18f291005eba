"""What the per-project caches of the request path (override keys, custom LLMs, model
settings) share: one replicated entry per project, and the three ways their syncs
drop entries when the database changes (see ``app.lib.replicated_cache``)."""

from __future__ import annotations

from typing import Generic, TypeVar
from uuid import UUID

from app.lib.replicated_cache import ReplicatedCache

V = TypeVar("V")


class ProjectCache(Generic[V]):
    """Base of a per-project cache; the subclass makes ``_entries`` and reads it."""

    _entries: ReplicatedCache[UUID, V]

    def invalidate_project(self, project_id: UUID) -> None:
        """The project's data changed: its next request reads it again."""
        self._entries.invalidate(project_id)

    def invalidate_all(self) -> None:
        """Forget every project (a change that concerns them all)."""
        self._entries.invalidate_all()

    def mark_all_stale(self) -> None:
        """Events may have been lost (a resubscription, the periodic safety net): read
        each project again on its next request, but keep what is held to serve while
        the database cannot be read."""
        self._entries.mark_all_stale()

    def __len__(self) -> int:
        """Projects cached (including those cached as having nothing)."""
        return len(self._entries)
