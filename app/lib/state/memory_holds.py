"""The in-memory bookkeeping of reservations (``MemoryStateStore.reserve``).

A window's live holds sit beside its counter (on the window's entry, so they end
with the window); the store also keeps each hold's record (which windows, how much)
to settle or release it by id.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

# Settled holds leave their expiry in the heap (removing from the middle of a heap is
# O(n)); past this many stale entries per live one the heap is rebuilt.
_STALE_FACTOR = 2
_STALE_SLACK = 64


@dataclass(frozen=True, slots=True)
class Hold:
    expires_at: float
    amounts: dict[str, int]
    """Window key -> units reserved there, in the order the windows were given."""

    def live(self, now: float) -> bool:
        return self.expires_at > now


class WindowHolds:
    """The live holds of one window: amounts by hold id, and a heap of expiries so
    that purging the expired ones costs O(log n) each, not a scan per reservation."""

    __slots__ = ("_amounts", "_expiries")

    def __init__(self) -> None:
        self._amounts: dict[str, tuple[int, float]] = {}
        self._expiries: list[tuple[float, str]] = []

    def __len__(self) -> int:
        """Expiries kept, those of holds already settled included."""
        return len(self._expiries)

    def add(self, hold_id: str, amount: int, expires_at: float) -> None:
        self._amounts[hold_id] = (amount, expires_at)
        heapq.heappush(self._expiries, (expires_at, hold_id))

    def take(self, hold_id: str) -> int | None:
        """Remove the hold; its amount, or None when this window does not have it."""
        item = self._amounts.pop(hold_id, None)
        if item is None:
            return None
        if len(self._expiries) > _STALE_FACTOR * len(self._amounts) + _STALE_SLACK:
            self._expiries = [(e, h) for h, (_, e) in self._amounts.items()]
            heapq.heapify(self._expiries)
        return item[0]

    def reduce(self, hold_id: str, units: int) -> int | None:
        """Take up to ``units`` out of the hold, keeping it; the units taken, or None
        when this window does not have the hold."""
        item = self._amounts.get(hold_id)
        if item is None:
            return None
        taken = min(units, item[0])
        self._amounts[hold_id] = (item[0] - taken, item[1])
        return taken

    def extend(self, hold_id: str, expires_at: float) -> bool:
        """Move the hold's end; False when this window does not have it."""
        item = self._amounts.get(hold_id)
        if item is None:
            return False
        # The old heap entry turns stale (its expiry no longer matches) and is skipped.
        self.add(hold_id, item[0], expires_at)
        return True

    def purge(self, now: float) -> int:
        """Drop the holds expired at ``now``; the units they held."""
        freed = 0
        while self._expiries and self._expiries[0][0] <= now:
            expires_at, hold_id = heapq.heappop(self._expiries)
            item = self._amounts.get(hold_id)
            # A stale heap entry (settled hold, or an id reused later) is skipped.
            if item is not None and item[1] == expires_at:
                del self._amounts[hold_id]
                freed += item[0]
        return freed

    def split(self, now: float) -> tuple[int, int]:
        """Units of the holds expired at ``now`` (not yet purged), and of the live ones."""
        expired = live = 0
        for amount, expires_at in self._amounts.values():
            if expires_at <= now:
                expired += amount
            else:
                live += amount
        return expired, live
