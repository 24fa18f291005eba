"""In-process index of active API keys, so authentication needs no database query.

Every active key's hash is held in memory (loaded at start-up, kept current by
events from whichever replica creates or revokes a key, and reloaded on an
interval as a safety net). An unknown hash is rejected from memory. Because an
event can be missed, a miss may fall through to the database, but only within a
small global budget per second and never twice for the same hash within the
negative-cache TTL: a flood of random keys costs a bounded number of queries.

Changes that arrive while a database read is in flight are not lost to it: a
reload replays the adds and removals made during the load on top of what it read,
and a miss lookup that raced a removal answers its one request but is not cached
(otherwise a key revoked meanwhile could come back until the next reload).

While the database is unreachable, known keys keep working from memory. A key that
is not in the index cannot be checked, so it is answered with
``DatabaseUnavailableError`` (503 ``database_unavailable``), not 401: the index is
only as complete as the events it received, and telling a client whose key was
created just before the outage that its key is invalid would be wrong. After one
failed lookup, misses are answered that way from memory for ``outage_backoff``
seconds (no query per attempt), so a flood of unknown keys during an outage costs
one connection attempt per interval.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.models import ApiKey
from app.db.outage import DatabaseUnavailableError, is_database_outage
from app.domain.accounts.governance import UNRESTRICTED, KeyPolicy

UNVERIFIABLE_KEY = (
    "this API key cannot be checked right now: the database is unreachable and the key "
    "is not among those this server knows; retry shortly"
)
DEFAULT_OUTAGE_BACKOFF = 1.0


@dataclass(frozen=True, slots=True)
class ActiveApiKey:
    key_id: UUID
    project_id: UUID
    policy: KeyPolicy = UNRESTRICTED
    """The key's governance (expiry, allowed models, limits), enforced per call."""


@dataclass(frozen=True, slots=True)
class _Added:
    key_hash: str
    key: ActiveApiKey


@dataclass(frozen=True, slots=True)
class _Removed:
    key_hash: str


@dataclass(frozen=True, slots=True)
class _ProjectRemoved:
    project_id: UUID


_Change = _Added | _Removed | _ProjectRemoved


def active_key(row: ApiKey) -> ActiveApiKey:
    """What the index holds of a key row."""
    return ActiveApiKey(key_id=row.id, project_id=row.project_id, policy=KeyPolicy.of_row(row))


KeyLoader = Callable[[], Awaitable[Iterable[tuple[str, ActiveApiKey]]]]
KeyLookup = Callable[[str], Awaitable[ActiveApiKey | None]]


def db_key_loaders(db_config: SQLAlchemyAsyncConfig) -> tuple[KeyLoader, KeyLookup]:
    """Every active key (the index's warm-up) and one by hash (a miss), each in a short
    session of its own: the index is not tied to a request."""

    async def load_all() -> Iterable[tuple[str, ActiveApiKey]]:
        async with db_config.get_session() as session:
            rows = await session.scalars(select(ApiKey).where(ApiKey.revoked_at.is_(None)))
            return [(row.key_hash, active_key(row)) for row in rows]

    async def lookup_one(key_hash: str) -> ActiveApiKey | None:
        async with db_config.get_session() as session:
            row = await session.scalar(
                select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
            )
            return None if row is None else active_key(row)

    return load_all, lookup_one


class ApiKeyIndex:
    def __init__(
        self,
        load_all: KeyLoader,
        lookup_one: KeyLookup,
        *,
        negative_ttl: float = 5.0,
        negative_capacity: int = 10_000,
        miss_lookups_per_second: float = 20.0,
        outage_backoff: float = DEFAULT_OUTAGE_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load_all = load_all
        self._lookup_one = lookup_one
        self._negative_ttl = negative_ttl
        self._negative_capacity = negative_capacity
        self._rate = miss_lookups_per_second
        self._outage_backoff = outage_backoff
        # Until then, misses are answered "cannot be checked" without a query.
        self._unreachable_until = float("-inf")
        self._clock = clock
        self._active: dict[str, ActiveApiKey] = {}
        self._negative: OrderedDict[str, float] = OrderedDict()
        self._tokens = miss_lookups_per_second
        self._tokens_at = clock()
        self.database_lookups = 0
        # One journal per reload in flight; every change is recorded in each of them.
        self._journals: list[list[_Change]] = []
        # Bumped by every removal so a miss lookup can tell it raced one.
        self._removals = 0

    def __len__(self) -> int:
        return len(self._active)

    def __contains__(self, key_hash: object) -> bool:
        return key_hash in self._active

    async def reload(self) -> None:
        journal: list[_Change] = []
        self._journals.append(journal)
        try:
            loaded = dict(await self._load_all())
        finally:
            self._journals.remove(journal)
        for change in journal:
            _apply(loaded, change)
        self._active = loaded
        self._negative.clear()

    def add(self, key_hash: str, key: ActiveApiKey) -> None:
        self._record(_Added(key_hash, key))
        self._active[key_hash] = key
        self._negative.pop(key_hash, None)

    def remove(self, key_hash: str) -> None:
        self._record(_Removed(key_hash))
        self._removals += 1
        self._active.pop(key_hash, None)

    def remove_project(self, project_id: UUID) -> None:
        change = _ProjectRemoved(project_id)
        self._record(change)
        self._removals += 1
        _apply(self._active, change)

    async def refresh(self, key_hash: str, *, created: bool = False) -> None:
        """Another replica created this key or changed its governance: read it (a key
        that is gone or revoked meanwhile leaves the index). A failed read keeps what
        is held until the periodic reload. Only held keys are re-read on a change."""
        if not created and key_hash not in self._active:
            return
        removals = self._removals
        found = await self._lookup_one(key_hash)
        if found is None:
            self.remove(key_hash)
        elif removals == self._removals:
            self.add(key_hash, found)

    def _record(self, change: _Change) -> None:
        for journal in self._journals:
            journal.append(change)

    async def resolve(self, key_hash: str) -> ActiveApiKey | None:
        found = self._active.get(key_hash)
        if found is not None:
            return found
        now = self._clock()
        expires = self._negative.get(key_hash)
        if expires is not None and expires > now:
            return None
        if now < self._unreachable_until:
            raise DatabaseUnavailableError(UNVERIFIABLE_KEY)
        if not self._take_lookup_token(now):
            return None
        self.database_lookups += 1
        removals = self._removals
        try:
            found = await self._lookup_one(key_hash)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            self._unreachable_until = self._clock() + self._outage_backoff
            raise DatabaseUnavailableError(UNVERIFIABLE_KEY) from exc
        if found is None:
            self._remember_miss(key_hash, now)
        elif removals == self._removals:
            self._active[key_hash] = found
        return found

    def _take_lookup_token(self, now: float) -> bool:
        self._tokens = min(self._rate, self._tokens + (now - self._tokens_at) * self._rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _remember_miss(self, key_hash: str, now: float) -> None:
        self._negative[key_hash] = now + self._negative_ttl
        self._negative.move_to_end(key_hash)
        while len(self._negative) > self._negative_capacity:
            self._negative.popitem(last=False)


def _apply(active: dict[str, ActiveApiKey], change: _Change) -> None:
    if isinstance(change, _Added):
        active[change.key_hash] = change.key
    elif isinstance(change, _Removed):
        active.pop(change.key_hash, None)
    else:
        for key_hash in [h for h, k in active.items() if k.project_id == change.project_id]:
            del active[key_hash]
