"""Leases: room for several calls of one caller, reserved in one store call and
handed out by this replica without asking the store again.

A reserved call costs two store calls (the reservation, its settle), each naming
every window the call counts in: with budgets and token limits on, that is most of
what admission costs. While a caller's windows have plenty of room, the gate
reserves room for ``n`` calls of the current call's size as one hold (a lease) and
admits the next calls of the same caller (same plan: project, limits, key, minute)
from it, in memory. Each call still ends in the store, as a part of the lease's hold
(``StateStore.settle_part``; the parts of one turn summed into one call): its
estimate leaves the hold and its actual use is counted, so what calls used is counted
as soon as they end, and a SIGKILLed replica loses only the unused rest, which comes
back when the lease's hold expires, like any in-flight call's.

Exactness: a lease's room is reserved atomically like a call's, and calls are
admitted only from it, so no window ever admits past its limit (the overshoot is
still only what calls use beyond their estimates). What a lease costs is the other
way: room it holds but has not handed out is unavailable to other replicas until it
is used, or returned when the lease closes (after ``LEASE_SECONDS`` at most, or when a
call no longer fits). That is why a lease takes at most ``1 / LEASE_SHARE`` of the
room any of its windows has left, and none is taken below ``MIN_LEASE_CALLS`` calls:
near a limit (less than ``LEASE_SHARE * MIN_LEASE_CALLS`` calls of room) every call
reserves alone, exactly as without leases, and far from it a replica's held rest is
a small share of what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from app.domain.quotas.holds import HoldKeeper, SettleBatch
from app.domain.quotas.windows import PlannedWindow
from app.lib.state.base import MultiWindowDecision

LEASE_SHARE = 64
"""A lease takes at most this fraction (1/64) of the room left in each window."""
MIN_LEASE_CALLS = 2
MAX_LEASE_CALLS = 32
LEASE_SECONDS = 0.25
"""A lease admits for at most this long; then what it did not hand out goes back."""
MAX_KNOWN_PLANS = 10_000

Plan = tuple[PlannedWindow, ...]


async def _nothing() -> None:
    return None


class Lease:
    """One lease: its hold, what it may still hand out per window, its calls running."""

    __slots__ = ("_leases", "_timer", "hold_id", "in_flight", "open", "room", "windows")

    def __init__(self, leases: Leases, hold_id: str, windows: Plan, room: list[int]) -> None:
        self._leases = leases
        self.hold_id = hold_id
        self.windows = windows
        self.room = room
        self.in_flight = 1  # the call that took it
        self.open = True
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            LEASE_SECONDS, self.close
        )

    def take(self, amounts: Sequence[int]) -> bool:
        """Hand out room for a call of ``amounts`` (per window); False (and the lease
        closes) when it has not that much left."""
        if not self.open:
            return False
        room = self.room
        for i, amount in enumerate(amounts):
            if amount > room[i]:
                self.close()
                return False
        for i, amount in enumerate(amounts):
            room[i] -= amount
        self.in_flight += 1
        return True

    def close(self) -> None:
        """Hand out nothing more; return the rest once the calls running have ended."""
        if not self.open:
            return
        self.open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._leases.closed(self)
        if self.in_flight == 0:
            self._leases.release(self)

    def ended(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and not self.open:
            self._leases.release(self)


class LeasedHold:
    """A call admitted from a lease (a ``CallHold``): settles as a part of it."""

    __slots__ = ("_batch", "_lease", "amounts", "settled")

    def __init__(self, lease: Lease, amounts: Sequence[int], batch: SettleBatch) -> None:
        self._lease = lease
        self._batch = batch
        self.amounts = amounts
        self.settled = False

    @property
    def hold_id(self) -> str:
        return self._lease.hold_id

    def settle(self, tokens: int, cost_micros: int) -> Awaitable[None]:
        """As ``Hold.settle``: the request stays counted, tokens and cost become the
        actual ones; never raises."""
        if self.settled:
            return _nothing()
        values = {"requests": 1, "tokens": tokens, "cost": cost_micros}
        return self._end([values[w.metric] for w in self._lease.windows])

    def release(self) -> Awaitable[None]:
        """The call never reached an upstream: nothing of it is counted."""
        if self.settled:
            return _nothing()
        return self._end([0] * len(self.amounts))

    def _end(self, actual: list[int]) -> Awaitable[None]:
        self.settled = True
        lease = self._lease
        done = self._batch.join_part(lease.hold_id, lease.windows, self.amounts, actual)
        lease.ended()
        return done


class Leases:
    """A gate's leases, by plan (see the module doc)."""

    __slots__ = ("_batch", "_keeper", "_open", "_pending", "_sizes")

    def __init__(self, batch: SettleBatch, keeper: HoldKeeper) -> None:
        self._batch = batch
        self._keeper = keeper
        self._pending: dict[int, tuple[Plan, asyncio.Future[None]]] = {}
        # By the plan's id, with the plan itself to tell a reused id (the plan cache
        # hands one tuple per caller and minute).
        self._open: dict[int, Lease] = {}
        self._sizes: dict[int, tuple[Plan, int]] = {}

    def take(self, plan: Plan, amounts: Sequence[int]) -> LeasedHold | None:
        """A call admitted from the plan's open lease, if it has room for it."""
        lease = self._open.get(id(plan))
        if lease is None or lease.windows is not plan or not lease.take(amounts):
            return None
        return LeasedHold(lease, amounts, self._batch)

    def pending(self, plan: Plan) -> asyncio.Future[None] | None:
        """Done when the lease being reserved for ``plan`` now is open (or was not
        granted); None when none is being reserved."""
        found = self._pending.get(id(plan))
        return found[1] if found is not None and found[0] is plan else None

    def begin(self, plan: Plan) -> asyncio.Future[None]:
        """A lease of ``plan`` is being reserved: the plan's next calls wait for it
        rather than each reserving a lease of their own (at concurrency, the calls
        arriving while a lease is reserved would otherwise all do so)."""
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[id(plan)] = (plan, waiting)
        return waiting

    def end(self, plan: Plan, waiting: asyncio.Future[None]) -> None:
        if self._pending.get(id(plan), (None, None))[1] is waiting:
            del self._pending[id(plan)]
        if not waiting.done():
            waiting.set_result(None)

    def calls_to_reserve(self, plan: Plan) -> int:
        """How many calls the next reservation of ``plan`` reserves room for: 1, or a
        lease's worth when the last answer showed plenty of room."""
        known = self._sizes.get(id(plan))
        return known[1] if known is not None and known[0] is plan else 1

    def learn(self, plan: Plan, amounts: Sequence[int], decision: MultiWindowDecision) -> None:
        """Size the plan's next lease from the counts a reservation answered."""
        room_calls: int | None = None
        for window, amount, count in zip(plan, amounts, decision.windows, strict=True):
            if window.limit is None or amount <= 0:
                continue
            calls = max(0, window.limit - count.current) // amount
            room_calls = calls if room_calls is None else min(room_calls, calls)
        calls = MAX_LEASE_CALLS if room_calls is None else room_calls // LEASE_SHARE
        calls = min(calls, MAX_LEASE_CALLS)
        if len(self._sizes) >= MAX_KNOWN_PLANS:
            self._sizes.clear()
        self._sizes[id(plan)] = (plan, calls if calls >= MIN_LEASE_CALLS else 1)

    def open(self, plan: Plan, hold_id: str, amounts: Sequence[int], calls: int) -> LeasedHold:
        """A lease just reserved as ``hold_id`` for ``calls`` calls of ``amounts``,
        the first of which is the caller's."""
        previous = self._open.get(id(plan))
        if previous is not None:
            previous.close()
        lease = Lease(self, hold_id, plan, [a * (calls - 1) for a in amounts])
        self._open[id(plan)] = lease
        self._keeper.keep(lease)
        return LeasedHold(lease, amounts, self._batch)

    def closed(self, lease: Lease) -> None:
        if self._open.get(id(lease.windows)) is lease:
            del self._open[id(lease.windows)]

    def release(self, lease: Lease) -> None:
        self._keeper.drop(lease)
        self._batch.join_release(lease.hold_id)

    def close_all(self) -> None:
        """Close every lease (shutdown): the rest of each goes back once its calls end."""
        for lease in list(self._open.values()):
            lease.close()
