"""The override index: which BYO key (if any) a request uses, answered from memory.

For the gateway and the runtime chat (the lead's wiring)
=========================================================

The index is a per-process resource: ``resources.override_index`` (an
``OverrideIndex``; also the ``override_index`` dependency). Its sync object is
``resources.override_sync`` (``OverrideSync`` in ``sync.py``), run by the lifespan.

::

    matched = await override_index.match(project_id, conversation_id, model)
    if matched is not None:
        matched.api_key          # str, the decrypted provider key: forward it, never log it
        matched.override_id      # UUID of the override_keys row
        matched.model_prefix     # str, the prefix that matched (the stored ``modelId``)
        matched.conversation_id  # str, as stored (equal to the one asked for)

- ``project_id: UUID``, ``conversation_id: str | None`` (the request's conversation id,
  compared exactly; ``None`` or ``""`` never matches and costs nothing), ``model: str``
  (the model id as the client asked for it; compared with ``str.startswith``, case
  sensitive, before any alias resolution or normalisation you may apply).
- Matching: an override of the same project and conversation whose ``model_prefix`` is
  a prefix of ``model`` (``qwen-qwq-32b`` matches ``qwen-qwq-32b-high``); when several
  match, the longest prefix wins. Prefixes are unique per (project, conversation), so
  the winner is unambiguous.
- Cost: in steady state one dict lookup per project (two when the project has
  overrides, plus a short scan of that conversation's prefixes); no database query.
  A project with no overrides is cached too (negative entry). The first request of a
  project after start-up, eviction or an invalidation loads its overrides with one
  query (concurrent first requests share it); that load's errors (database down)
  propagate from ``match``.
- ``MatchedOverride.__repr__`` leaves the key out; still, never log the object's
  fields wholesale.

Cache rules: entries per project, loaded whole (decrypted at load; keys live only in
this process's memory), bounded by ``max_projects`` and ``max_overrides`` (the oldest
entries are dropped first and reloaded when next asked). A change through the API
drops the project's entry at once on the replica that made it and, through
``OverrideSync`` (channel ``overrides.changed``), on every other replica. Every
(re)subscription and a periodic safety net in the lifespan mark all entries stale
(``mark_all_stale``): each project is read again on its next request, so a lost event
heals within ``OVERRIDE_RELOAD_SECONDS``. A load that started before an invalidation
is not cached (epoch guard): it cannot resurrect a deleted key.

Database down: a stale entry is only a suspicion of a lost event, so when its
re-read fails the entry is served as it is (and the read retried after
``STALE_RETRY_SECONDS``): warm projects keep their keys through an outage. A project
dropped by a change (``invalidate_project``) or never read has nothing to fall back
on; its first request raises the loader's error (``DatabaseUnavailableError``, a 503,
in the app).

This module has no database or framework code: the loader is handed in
(``services.load_project_overrides`` in the app, a plain function in tests).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from uuid import UUID

from app.domain.project_cache import ProjectCache
from app.lib.replicated_cache import ReplicatedCache

# Projects kept at most; past that the oldest entries are dropped.
DEFAULT_MAX_PROJECTS = 10_000
# Overrides kept at most over all projects (a project with none counts as one).
DEFAULT_MAX_OVERRIDES = 100_000


@dataclass(frozen=True, slots=True)
class LoadedOverride:
    """One decrypted override, as the loader hands it to the index."""

    id: UUID
    conversation_id: str
    model_prefix: str
    api_key: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class MatchedOverride:
    """The override a request uses: forward ``api_key`` upstream, never log it."""

    override_id: UUID
    conversation_id: str
    model_prefix: str
    api_key: str = field(repr=False)


OverrideLoader = Callable[[UUID], Awaitable[Iterable[LoadedOverride]]]


@dataclass(frozen=True, slots=True)
class _Entry:
    by_conversation: Mapping[str, tuple[MatchedOverride, ...]]
    """Each conversation's overrides, longest prefix first."""
    weight: int


_NOTHING: Mapping[str, tuple[MatchedOverride, ...]] = MappingProxyType({})


def _entry(overrides: Iterable[LoadedOverride]) -> _Entry:
    grouped: dict[str, list[MatchedOverride]] = {}
    count = 0
    for o in overrides:
        count += 1
        grouped.setdefault(o.conversation_id, []).append(
            MatchedOverride(
                override_id=o.id,
                conversation_id=o.conversation_id,
                model_prefix=o.model_prefix,
                api_key=o.api_key,
            )
        )
    if not count:
        return _Entry(by_conversation=_NOTHING, weight=1)
    by_conversation = {
        conversation: tuple(
            sorted(found, key=lambda m: (-len(m.model_prefix), m.model_prefix, m.override_id))
        )
        for conversation, found in grouped.items()
    }
    return _Entry(by_conversation=by_conversation, weight=count)


def _weight(entry: _Entry) -> int:
    return entry.weight


class OverrideIndex(ProjectCache[_Entry]):
    def __init__(
        self,
        loader: OverrideLoader,
        *,
        max_projects: int = DEFAULT_MAX_PROJECTS,
        max_overrides: int = DEFAULT_MAX_OVERRIDES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_projects < 1 or max_overrides < 1:
            raise ValueError("max_projects and max_overrides must be at least 1")

        async def read(project_id: UUID) -> _Entry:
            return _entry(await loader(project_id))

        # Oldest first; a project heavier than the whole budget is still kept alone.
        self._entries: ReplicatedCache[UUID, _Entry] = ReplicatedCache(
            read,
            "override keys",
            max_entries=max_projects,
            weight=_weight,
            max_weight=max_overrides,
            clock=clock,
        )

    # ------------------------------------------------------------------ reading

    async def match(
        self, project_id: UUID, conversation_id: str | None, model: str
    ) -> MatchedOverride | None:
        """The override for this request, or ``None`` (see the module docstring)."""
        if not conversation_id:
            return None
        entry = await self._entries.get(project_id)
        candidates = entry.by_conversation.get(conversation_id)
        if candidates is None:
            return None
        for candidate in candidates:
            if model.startswith(candidate.model_prefix):
                return candidate
        return None

    def is_cached(self, project_id: UUID) -> bool:
        """Whether the project's overrides are in memory and current (a ``match``
        costs no query)."""
        return self._entries.is_current(project_id)

    @property
    def cached_overrides(self) -> int:
        """The weight held: overrides cached, a project without any counting one."""
        return self._entries.weight
