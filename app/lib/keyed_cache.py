"""A bounded in-process cache of values loaded by key, one load per key at a time.

The per-project caches of the hot path (the profile catalog, the override index, the
custom LLM directory, the quota limits) share this mechanism; each adds its own
policy on top (rebuilding, matching, staleness):

- ``await cache.get(key)`` answers from memory; on a miss it loads the value with the
  loader handed in. Concurrent misses of a key share one load (single flight), and a
  caller that is cancelled does not cancel it for the others. A loader error is
  raised to every caller waiting on that load and is not cached: the next call loads
  again.
- ``invalidate(key)`` / ``invalidate_all()`` drop entries and bump an epoch: a load
  that started before an invalidation is never stored (it cannot bring back what the
  invalidation removed), though its waiters still get what it read; later callers
  start a new load.
- At most ``max_entries`` entries and, with a ``weight`` function, at most
  ``max_weight`` total weight are held; past that the oldest entries (by the time
  they were stored) are dropped first and loaded again when next asked for.

Framework-free; meant for one event loop (no locking). Values must not be ``None``
(``peek`` answers ``None`` for "not cached").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from typing import Generic, TypeVar

import structlog

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

STALE_RETRY_SECONDS = 5.0

logger = structlog.get_logger()


class KeyedCache(Generic[K, V]):
    __slots__ = (
        "_entries",
        "_epoch",
        "_loader",
        "_loading",
        "_max_entries",
        "_max_weight",
        "_weight",
        "_weight_of",
    )

    def __init__(
        self,
        loader: Callable[[K], Awaitable[V]],
        *,
        max_entries: int | None = None,
        weight: Callable[[V], int] | None = None,
        max_weight: int | None = None,
    ) -> None:
        """``max_entries``/``max_weight``: ``None`` is no bound. ``weight(value)`` is
        how much an entry counts against ``max_weight`` (each counts one without it);
        it must not change while the value is cached."""
        if (max_entries is not None and max_entries < 1) or (
            max_weight is not None and max_weight < 1
        ):
            raise ValueError("max_entries and max_weight must be at least 1")
        self._loader = loader
        self._max_entries = max_entries
        self._max_weight = max_weight
        self._weight_of = weight
        self._entries: dict[K, V] = {}
        self._weight = 0
        # One load per key at a time, shared by concurrent misses.
        self._loading: dict[K, asyncio.Task[V]] = {}
        # Bumped by every invalidation: a load that started before one is not stored.
        self._epoch = 0

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def weight(self) -> int:
        """The total weight of the entries held (their number without ``weight``)."""
        return self._weight

    def peek(self, key: K) -> V | None:
        """The cached value, or ``None``; never loads."""
        return self._entries.get(key)

    def values(self) -> Iterator[V]:
        """The cached values, oldest first (do not store or invalidate while iterating)."""
        return iter(self._entries.values())

    async def get(self, key: K) -> V:
        """The cached value; on a miss, what ``load`` answers."""
        value = self._entries.get(key)
        if value is not None:
            return value
        return await self.load(key)

    async def load(self, key: K) -> V:
        """Load ``key`` whether cached or not: join the load in flight, or start one.

        The value is stored unless an invalidation happened since the load started;
        the loader's error, if any, is raised here (and to every other waiter).
        """
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(key, self._epoch))
            self._loading[key] = task
            task.add_done_callback(partial(self._load_done, key))
        # Shielded: a cancelled caller leaves the shared load running for the others.
        return await asyncio.shield(task)

    # ---------------------------------------------------------------- writing

    def replace(self, key: K, old: V, new: V) -> bool:
        """Swap ``key``'s value for ``new`` if it is still ``old`` (the same object),
        keeping its place in the eviction order; whether it was swapped."""
        if self._entries.get(key) is not old:
            return False
        self._entries[key] = new
        self._weight += self._weigh(new) - self._weigh(old)
        return True

    def invalidate(self, key: K, *, keep_entry: bool = False) -> None:
        """``key`` changed: its next ``get`` loads it again.

        With ``keep_entry`` the entry stays readable through ``peek`` (a caller may
        fall back on it as stale) until a new load replaces it; the load in flight
        is forgotten and not stored either way.
        """
        self._epoch += 1
        if not keep_entry:
            self._drop(key)
        # A load in flight may have missed the change: later callers start a new one.
        self._loading.pop(key, None)

    def invalidate_all(self, *, keep_entries: bool = False) -> None:
        """Every key may have changed (as ``invalidate``, for all keys at once)."""
        self._epoch += 1
        if not keep_entries:
            self._entries.clear()
            self._weight = 0
        self._loading.clear()

    # ---------------------------------------------------------------- internals

    async def _load(self, key: K, epoch: int) -> V:
        value = await self._loader(key)
        if epoch == self._epoch:
            self._store(key, value)
        return value

    def _load_done(self, key: K, task: asyncio.Task[V]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled():
            task.exception()  # retrieved: its waiters (if any are left) get it raised

    def _weigh(self, value: V) -> int:
        return 1 if self._weight_of is None else self._weight_of(value)

    def _drop(self, key: K) -> None:
        value = self._entries.pop(key, None)
        if value is not None:
            self._weight -= self._weigh(value)

    def _store(self, key: K, value: V) -> None:
        # A reloaded key counts as the newest.
        self._drop(key)
        weight = self._weigh(value)
        # Oldest first; an entry heavier than the whole budget is still kept, alone.
        while self._entries and (
            (self._max_entries is not None and len(self._entries) >= self._max_entries)
            or (self._max_weight is not None and self._weight + weight > self._max_weight)
        ):
            self._drop(next(iter(self._entries)))
        self._entries[key] = value
        self._weight += weight


@dataclass(slots=True, eq=False)
class StaleWhileFailing(Generic[K, V]):
    """Serve a cached entry its owner marked out of date while it cannot be re-read.

    The per-project caches mark entries stale (``invalidate_all(keep_entries=True)``)
    when invalidation events may have been lost; the next call re-reads. If that read
    fails (the database is down) the stale entry is served and no re-read is tried
    for ``retry_seconds`` (one attempt per period, not one per request); an entry
    never read raises the loader's error. ``what`` names the values in the warning.
    """

    cache: KeyedCache[K, V]
    what: str
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    retry_seconds: float = STALE_RETRY_SECONDS
    _until: float = field(default=float("-inf"), init=False)

    def retry_now(self) -> None:
        """End the back-off: the next stale entry asked for is read again."""
        self._until = float("-inf")

    async def current(self, key: K, fresh: Callable[[V], bool]) -> V:
        """The entry for ``key``: cached when ``fresh(entry)``, else read again."""
        entry = self.cache.peek(key)
        if entry is not None and (fresh(entry) or self.clock() < self._until):
            return entry
        try:
            return await self.cache.load(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if entry is None:
                raise
            self._until = self.clock() + self.retry_seconds
            logger.warning(
                f"{self.what} could not be re-read; serving the cached ones",
                key=str(key),
                error=repr(exc),
            )
            return entry
