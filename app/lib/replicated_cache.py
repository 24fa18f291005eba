"""The one base of the replicated per-key caches of the hot path.

Every process keeps some database rows in memory (override keys, custom LLMs, model
settings, quota limits) and must never serve them longer than it takes an event to
cross the ``EventBus`` once another replica changed them. Two halves:

``ReplicatedCache`` is the local side: values loaded by key on a miss
(``KeyedCache``: one load per key at a time, bounded, a load overtaken by an
invalidation never stored), and two kinds of "maybe out of date":

- ``invalidate(key)``: the key changed. Its entry goes (or, with
  ``keep_on_invalidate``, stays only as a fallback) and the next ``get`` reads again.
- ``mark_all_stale()``: events may have been lost (a resubscription, a periodic
  safety net, the state store back after an outage). Every entry is read again on its
  next ``get``; an entry whose re-read fails is served as it is and not retried for
  ``retry_seconds`` (one attempt per period, not one per request). ``max_age`` makes
  entries stale on their own after that many seconds.

``CacheSync`` is the replication side: the service that wrote calls ``changed``
(or ``publish``), which forgets the key on this replica at once and publishes a hint
carrying this replica's ``origin``; other replicas apply it in ``run`` (which
follows the channel with ``app.lib.events.follow``: subscribe, then ``reload``) and
skip their own. ``reload`` is also the hook the server calls after an outage.
Events are hints, never data: the database stays the source of truth.

Event shape (a JSON object; the bus adds ``channel``)::

    {"kind": "<kind>", "<key field>": "<uuid>", "origin": "<replica id>"}

Framework-free; one event loop. Values must not be ``None``.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar
from uuid import UUID, uuid4

import structlog

from app.lib.events.base import Event, EventBus
from app.lib.events.follow import follow
from app.lib.keyed_cache import STALE_RETRY_SECONDS, KeyedCache, StaleWhileFailing

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

logger = structlog.get_logger()

_ALWAYS = float("inf")


@dataclass(slots=True)
class _Held(Generic[V]):
    value: V
    generation: int
    """The cache's generation when the read started (older: stale)."""
    expires: float
    """Stale from then on (``max_age``)."""


class ReplicatedCache(Generic[K, V]):
    """Values loaded by key, kept in memory until invalidated (see the module doc).

    ``what`` names the values in the warning logged when a stale one is served.
    ``max_entries`` / ``weight`` / ``max_weight`` bound what is held (``KeyedCache``).
    """

    __slots__ = (
        "_clock",
        "_entries",
        "_generation",
        "_keep_on_invalidate",
        "_loader",
        "_max_age",
        "_stale",
    )

    def __init__(
        self,
        loader: Callable[[K], Awaitable[V]],
        what: str,
        *,
        max_entries: int | None = None,
        weight: Callable[[V], int] | None = None,
        max_weight: int | None = None,
        max_age: float | None = None,
        keep_on_invalidate: bool = False,
        clock: Callable[[], float] = time.monotonic,
        retry_seconds: float = STALE_RETRY_SECONDS,
    ) -> None:
        self._loader = loader
        self._max_age = max_age
        self._keep_on_invalidate = keep_on_invalidate
        self._clock = clock
        # Entries read before the last ``mark_all_stale`` are stale.
        self._generation = 0
        self._entries: KeyedCache[K, _Held[V]] = KeyedCache(
            self._read,
            max_entries=max_entries,
            weight=None if weight is None else (lambda held: weight(held.value)),
            max_weight=max_weight,
        )
        self._stale = StaleWhileFailing(
            self._entries, what, clock=clock, retry_seconds=retry_seconds
        )

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def weight(self) -> int:
        """The total weight held (the number of entries without ``weight``)."""
        return self._entries.weight

    def peek(self, key: K) -> V | None:
        """The held value, current or not, or ``None``; never loads."""
        held = self._entries.peek(key)
        return None if held is None else held.value

    def is_current(self, key: K) -> bool:
        """Whether ``key`` is held and a ``get`` would answer without a read."""
        held = self._entries.peek(key)
        return held is not None and self._is_fresh(held)

    async def get(self, key: K) -> V:
        """The value: held when current, else read again.

        When that read fails and a stale value is held, the stale value is served
        (and no key is read again for ``retry_seconds``); otherwise the error is
        raised.
        """
        return (await self._stale.current(key, self._is_fresh)).value

    # ---------------------------------------------------------------- writing

    def replace(self, key: K, old: V, new: V) -> bool:
        """Swap ``key``'s value for ``new`` if it is still ``old`` (a rebuild from
        held data), keeping its age; whether it was swapped."""
        held = self._entries.peek(key)
        if held is None or held.value is not old:
            return False
        return self._entries.replace(key, held, _Held(new, held.generation, held.expires))

    def invalidate(self, key: K) -> None:
        """``key`` changed: its next ``get`` reads it again."""
        self._entries.invalidate(key, keep_entry=self._keep_on_invalidate)
        held = self._entries.peek(key)
        if held is not None:
            # Kept only as the fallback of a failed re-read, which is tried at once.
            held.generation = -1
            self._stale.retry_now()

    def invalidate_all(self) -> None:
        """Every key may have changed (as ``invalidate``, for all at once)."""
        if self._keep_on_invalidate:
            self.mark_all_stale()
            self._stale.retry_now()
        else:
            self._entries.invalidate_all()

    def mark_all_stale(self) -> None:
        """Events may have been lost: read each key again on its next ``get``, but
        keep what is held to serve while it cannot be read."""
        self._generation += 1
        self._entries.invalidate_all(keep_entries=True)

    # ---------------------------------------------------------------- internals

    def _is_fresh(self, held: _Held[V]) -> bool:
        if held.generation != self._generation:
            return False
        return self._max_age is None or self._clock() < held.expires

    async def _read(self, key: K) -> _Held[V]:
        generation = self._generation
        value = await self._loader(key)
        expires = _ALWAYS if self._max_age is None else self._clock() + self._max_age
        return _Held(value, generation, expires)


def uuid_field(event: Event, name: str) -> UUID | None:
    """The event's ``name`` field as a UUID, or ``None`` when missing or malformed."""
    raw = event.get(name)
    if not isinstance(raw, str):
        return None
    try:
        return UUID(raw)
    except ValueError:
        return None


class Changes(Protocol):
    """What a service that writes cached data calls after each write."""

    async def changed(self, key: UUID) -> None: ...


class _Unpublished:
    async def changed(self, key: UUID) -> None:
        """Nobody caches what this writer changes."""


UNPUBLISHED: Changes = _Unpublished()
"""The ``Changes`` of a service made outside a request (start-up seeding, reads)."""


class CacheSync(ABC):
    """Keeps one kind of cached data equal on every replica over ``channel``.

    Subclasses say what a change forgets locally (``forget``) and what a
    (re)subscription or a resync re-reads (``reload``); events of other kinds are
    handled by overriding ``apply_other``. ``what`` names the data in log lines.
    """

    key_field = "projectId"

    def __init__(self, bus: EventBus, channel: str, kind: str, what: str) -> None:
        self._bus = bus
        self.channel = channel
        self.kind = kind
        self._what = what
        self.origin = uuid4().hex
        """This process's id in events, so it can skip what it published itself."""

    # --------------------------------------------------------------- local writes

    async def changed(self, key: UUID) -> None:
        """Called by the service that wrote data of ``key``: forgotten here at once,
        on the other replicas when the event arrives."""
        await self.forget(key)
        await self.publish({"kind": self.kind, self.key_field: str(key)})

    async def publish(self, event: Event) -> None:
        """Publish ``event`` with this replica's origin; a failure is only logged
        (a hint channel: the write itself has succeeded)."""
        try:
            await self._bus.publish(self.channel, {**event, "origin": self.origin})
        except Exception as exc:
            logger.warning(f"could not publish a change of {self._what}", error=repr(exc))

    # --------------------------------------------------------- other replicas

    async def apply(self, event: Event) -> None:
        """Apply an event from another replica; our own are already applied."""
        if event.get("origin") == self.origin:
            return
        key = uuid_field(event, self.key_field)
        if event.get("kind") == self.kind and key is not None:
            await self.forget(key)
            return
        if not await self.apply_other(event):
            logger.warning(f"ignoring malformed event about {self._what}", kind=event.get("kind"))

    async def apply_other(self, event: Event) -> bool:
        """An event not of ``kind`` (or without a key): whether it was applied."""
        return False

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow other replicas' changes until cancelled; ``ready`` is set once
        subscribed and reloaded."""
        await follow(self._bus, self.channel, reload=self.reload, apply=self.apply, ready=ready)

    # ------------------------------------------------- each area's cache says how

    @abstractmethod
    async def forget(self, key: UUID) -> None:
        """Drop what is cached about ``key`` on this replica."""

    @abstractmethod
    async def reload(self) -> None:
        """Events may have been lost (after (re)subscribing, a periodic safety net,
        the server's resync after an outage): have everything re-read."""
