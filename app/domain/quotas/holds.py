"""One admitted call's reservation, from admission to settle.

``QuotaGate.reserve`` holds a call's estimated tokens and cost (and its one request)
in every window it counts in; the ``Hold`` it returns travels with the call's record
and the meter settles it when the call is over: tokens and cost become what the call
actually used (the rest of the estimate is given back; an overage is counted), the
request stays counted.

The hold lives ``hold_ttl`` seconds in the store, so that a SIGKILLed replica's
in-flight units come back on their own. A call that runs longer keeps its hold alive:
the gate's ``HoldKeeper`` (one timer for all of a gate's holds, no per-call timer,
task or per-chunk work) extends each hold a quarter to a half TTL after it was taken
or last extended, until the settle, for at most ``MAX_EXTENDED_SECONDS``.

When the settle cannot reach its hold (the store was down for longer than the hold
lived, or the extension failed), the call's actual units are added to the windows
that are still open with plain increments, so what a call used is counted either way;
only the store being down at settle time too loses them (``arona_quota_settle_failures
_total``, and the overshoot docs/deployment.md describes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from app.domain.quotas.windows import PlannedWindow
from app.lib.log_budget import RepeatBudget
from app.lib.state.base import StateStore

logger = structlog.get_logger()

Clock = Callable[[], float]

MAX_EXTENDED_SECONDS = 3600.0
"""A hold stops being extended after this long: a call that ran an hour without being
metered was abandoned by a bug, and its units must come back some day."""


async def _nothing() -> None:
    return None


class HoldFailures:
    """What the settles of one gate could not do, counted and logged sparingly."""

    __slots__ = ("_metric", "_warnings", "count")

    def __init__(self, metric: Any | None, log_interval: float) -> None:
        self._metric = metric
        self._warnings = RepeatBudget(interval=log_interval)
        self.count = 0

    def failed(self, message: str, exc: BaseException) -> None:
        self.count += 1
        if self._metric is not None:
            self._metric.inc()
        held = self._warnings.admit(message)
        if held is not None:
            logger.warning(message, error=repr(exc), failures_not_logged=held)


@dataclass(slots=True)
class _Part:
    """The calls of one lease that ended in one event-loop turn, summed."""

    windows: Sequence[PlannedWindow]
    held: list[int]
    actual: list[int]
    waiters: list[asyncio.Future[None]]


class SettleBatch:
    """Settles the holds of calls that end in the same event-loop turn in one store
    call (``settle_many``): each settle still waits for its batch's answer, so a
    settled call is settled (a client's next call sees what this one used), but at
    concurrency the store is called once per turn rather than once per call, and
    most of a settle's arguments (the windows every call of a project shares) are
    named once per batch. A settle whose hold was gone is counted late
    (``count_late``).

    Calls admitted under a lease (``app.domain.quotas.leases``) end as parts of the
    lease's hold: those of one lease in one turn are summed into one ``settle_part``,
    and a lease done with returns its rest (``release``) after its parts."""

    __slots__ = (
        "_clock",
        "_failures",
        "_parts",
        "_pending",
        "_releases",
        "_scheduled",
        "_store",
        "_tasks",
    )

    def __init__(self, store: StateStore, failures: HoldFailures, clock: Clock) -> None:
        self._store = store
        self._failures = failures
        self._clock = clock
        self._pending: list[tuple[Hold, dict[str, int], asyncio.Future[None]]] = []
        self._parts: dict[str, _Part] = {}
        self._releases: list[str] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def _schedule(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if not self._scheduled:
            self._scheduled = True
            task = loop.create_task(self._send_pending())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return loop

    def join(self, hold: Hold, actuals: dict[str, int]) -> asyncio.Future[None]:
        """Queue a settle now; the future is done once the batch it joined was sent
        (never an error). The batch leaves in the next event-loop turn, the one in
        which the usage entries of the same calls leave too, so on the app's script
        pipe both go out in one write."""
        done: asyncio.Future[None] = self._schedule().create_future()
        self._pending.append((hold, actuals, done))
        # Not shielded: an awaiter cancelled cancels only its own future, which the
        # batch then skips; the settle itself is sent all the same.
        return done

    def join_part(
        self,
        hold_id: str,
        windows: Sequence[PlannedWindow],
        held: Sequence[int],
        actual: Sequence[int],
    ) -> asyncio.Future[None]:
        """Queue the end of one call of a lease (``held`` leaves the lease's hold,
        ``actual`` is counted; per window); as ``join`` otherwise."""
        done: asyncio.Future[None] = self._schedule().create_future()
        part = self._parts.get(hold_id)
        if part is None:
            self._parts[hold_id] = _Part(windows, list(held), list(actual), [done])
        else:
            for i, (h, a) in enumerate(zip(held, actual, strict=True)):
                part.held[i] += h
                part.actual[i] += a
            part.waiters.append(done)
        return done

    def join_release(self, hold_id: str) -> None:
        """Queue giving back what a lease still holds, after its parts queued now."""
        self._schedule()
        self._releases.append(hold_id)

    async def _send_pending(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        parts, self._parts = self._parts, {}
        releases, self._releases = self._releases, []
        try:
            # Started in this order, so on the script pipe they leave in one write and
            # a lease's rest is returned after its parts (either order counts right).
            await asyncio.gather(
                *([self._send(batch)] if batch else []),
                *(self._send_part(hold_id, part) for hold_id, part in parts.items()),
                *(self._release(hold_id) for hold_id in releases),
            )
        finally:
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)
            for part in parts.values():
                for done in part.waiters:
                    if not done.done():
                        done.set_result(None)

    async def _send(self, batch: list[tuple[Hold, dict[str, int], asyncio.Future[None]]]) -> None:
        try:
            results = await self._store.settle_many([(h.hold_id, a) for h, a, _ in batch])
            for (hold, actuals, _), settled in zip(batch, results, strict=True):
                if not settled:
                    await hold.count_late(actuals)
        except Exception as exc:
            self._failures.failed("could not settle a batch of quota holds", exc)

    async def _send_part(self, hold_id: str, part: _Part) -> None:
        counts = {
            w.key: (h, a) for w, h, a in zip(part.windows, part.held, part.actual, strict=True)
        }
        try:
            if not await self._store.settle_part(hold_id, counts):
                actuals = {key: actual for key, (_, actual) in counts.items()}
                await count_late(self._store, part.windows, actuals, self._clock())
        except Exception as exc:
            self._failures.failed("could not settle the calls of a quota lease", exc)

    async def _release(self, hold_id: str) -> None:
        try:
            await self._store.release(hold_id)
        except Exception as exc:
            self._failures.failed("could not return the rest of a quota lease", exc)

    async def drain(self) -> None:
        """Wait for every batch queued or under way (shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def count_late(
    store: StateStore, windows: Sequence[PlannedWindow], actuals: Mapping[str, int], now: float
) -> None:
    """A hold is gone (expired): count what its call used in the windows still open
    (a window not named in ``actuals``, a request window, counts 1)."""
    for window in windows:
        if window.resets_at <= now:
            continue
        amount = actuals.get(window.key, 1)
        if amount > 0:
            await store.incr(window.key, amount, ttl=window.ttl(now))


class Kept(Protocol):
    """What the keeper keeps alive: a call's hold, or a lease's."""

    @property
    def hold_id(self) -> str: ...


class CallHold(Protocol):
    """What a call's record settles: its own ``Hold``, or its part of a lease
    (``LeasedHold``)."""

    @property
    def hold_id(self) -> str: ...

    @property
    def settled(self) -> bool: ...

    def settle(self, tokens: int, cost_micros: int) -> Awaitable[None]: ...

    def release(self) -> Awaitable[None]: ...


class HoldKeeper:
    """Keeps a gate's live holds alive with one timer: a tick every quarter TTL (only
    while some hold is live) extends the holds taken or last extended at least a
    quarter TTL ago, so each is renewed with between a half and three quarters of its
    life left. A call costs a dict insert and a delete, where a timer of its own cost a
    heap push and left a cancelled handle in the loop's heap for the rest of its delay.
    Holds are kept in the order they were taken or last extended, so a tick stops at
    the first one still fresh."""

    __slots__ = ("_failures", "_live", "_store", "_tasks", "_timer", "hold_ttl")

    def __init__(self, store: StateStore, hold_ttl: float, failures: HoldFailures) -> None:
        self._store = store
        self.hold_ttl = hold_ttl
        self._failures = failures
        self._live: dict[Kept, tuple[float, float]] = {}
        """hold -> (loop time it was taken or last extended, loop time past which it is
        no longer extended)."""
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def keep(self, hold: Kept) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._live[hold] = (now, now + MAX_EXTENDED_SECONDS)
        if self._timer is None:
            self._timer = loop.call_later(self.hold_ttl / 4, self._tick)

    def drop(self, hold: Kept) -> None:
        self._live.pop(hold, None)

    def stop(self) -> None:
        """Extend nothing any more (shutdown; tests use it to play a dead replica)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._live.clear()

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        due_before = now - self.hold_ttl / 4
        due: list[Kept] = []
        for hold, (renewed, _until) in self._live.items():
            if renewed > due_before:
                break  # kept in renewal order: the rest are fresher
            due.append(hold)
        for hold in due:
            _, until = self._live.pop(hold)
            if now > until:
                continue  # abandoned by a bug: let its units come back
            self._live[hold] = (now, until)  # to the end: renewal order kept
            task = loop.create_task(self._extend(hold))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._timer = loop.call_later(self.hold_ttl / 4, self._tick) if self._live else None

    async def _extend(self, hold: Kept) -> None:
        try:
            alive = await self._store.extend(hold.hold_id, self.hold_ttl)
        except Exception as exc:
            self._failures.failed("could not extend a call's quota hold", exc)
            return  # the store is away: the next tick tries again
        if not alive:
            self._live.pop(hold, None)


class Hold:
    """A live reservation (see the module doc); ``settle`` exactly once."""

    __slots__ = (
        "_batch",
        "_clock",
        "_failures",
        "_keeper",
        "_store",
        "amounts",
        "hold_id",
        "settled",
        "windows",
    )

    def __init__(
        self,
        store: StateStore,
        hold_id: str,
        windows: Sequence[PlannedWindow],
        amounts: Sequence[int],
        *,
        keeper: HoldKeeper,
        clock: Clock,
        failures: HoldFailures,
        batch: SettleBatch | None = None,
    ) -> None:
        self._store = store
        self._batch = batch
        self.hold_id = hold_id
        self.windows = windows
        self.amounts = amounts
        self._keeper = keeper
        self._clock = clock
        self._failures = failures
        self.settled = False
        keeper.keep(self)

    def actuals(self, tokens: int, cost_micros: int) -> dict[str, int]:
        """The settle's actual amounts: tokens and cost; requests keep their 1."""
        values = {"tokens": tokens, "cost": cost_micros}
        return {w.key: values[w.metric] for w in self.windows if w.metric != "requests"}

    def settle(self, tokens: int, cost_micros: int) -> Awaitable[None]:
        """Turn the hold into what the call used (with the other calls that end in
        this event-loop turn, when the gate batches); never raises. The settle is
        under way when this returns (the meter sends the call's usage entry before
        awaiting it); awaiting tells it was sent."""
        if self.settled:
            return _nothing()
        self.settled = True
        self._keeper.drop(self)
        actuals = self.actuals(tokens, cost_micros)
        if self._batch is not None:
            return self._batch.join(self, actuals)
        return self._settle_alone(actuals)

    async def _settle_alone(self, actuals: dict[str, int]) -> None:
        try:
            if not await self._store.settle(self.hold_id, actuals):
                await self.count_late(actuals)
        except Exception as exc:
            self._failures.failed("could not settle a call's quota hold", exc)

    async def release(self) -> None:
        """The call never reached an upstream: give everything back; never raises."""
        if self.settled:
            return
        self.settled = True
        self._keeper.drop(self)
        try:
            await self._store.release(self.hold_id)
        except Exception as exc:
            self._failures.failed("could not release a call's quota hold", exc)

    async def count_late(self, actuals: dict[str, int]) -> None:
        """The hold is gone (expired): count the call in the windows still open."""
        await count_late(self._store, self.windows, actuals, self._clock())
