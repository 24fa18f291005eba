"""One admitted call's reservation, from admission to settle.

``QuotaGate.reserve`` holds a call's estimated tokens and cost (and its one request)
in every window it counts in; the ``Hold`` it returns travels with the call's record
and the meter settles it when the call is over: tokens and cost become what the call
actually used (the rest of the estimate is given back; an overage is counted), the
request stays counted.

The hold lives ``hold_ttl`` seconds in the store, so that a SIGKILLed replica's
in-flight units come back on their own. A call that runs longer keeps its hold alive:
a timer (no task, no per-chunk work) extends it every half TTL until the settle, for
at most ``MAX_EXTENDED_SECONDS``.

When the settle cannot reach its hold (the store was down for longer than the hold
lived, or the extension failed), the call's actual units are added to the windows
that are still open with plain increments, so what a call used is counted either way;
only the store being down at settle time too loses them (``arona_quota_settle_failures
_total``, and the overshoot docs/deployment.md describes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

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


class SettleBatch:
    """Settles the holds of calls that end in the same event-loop turn in one store
    call (``settle_many``): each settle still waits for its batch's answer, so a
    settled call is settled (a client's next call sees what this one used), but at
    concurrency the store is called once per turn rather than once per call, and
    most of a settle's arguments (the windows every call of a project shares) are
    named once per batch. A settle whose hold was gone is counted late
    (``Hold.count_late``)."""

    __slots__ = ("_failures", "_pending", "_store", "_tasks")

    def __init__(self, store: StateStore, failures: HoldFailures) -> None:
        self._store = store
        self._failures = failures
        self._pending: list[tuple[Hold, dict[str, int], asyncio.Future[None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def join(self, hold: Hold, actuals: dict[str, int]) -> asyncio.Future[None]:
        """Queue a settle now; the future is done once the batch it joined was sent
        (never an error). The batch leaves in the next event-loop turn, the one in
        which the usage entries of the same calls leave too, so on the app's script
        pipe both go out in one write."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if not self._pending:
            task = loop.create_task(self._send_pending())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._pending.append((hold, actuals, done))
        # Not shielded: an awaiter cancelled cancels only its own future, which the
        # batch then skips; the settle itself is sent all the same.
        return done

    async def _send_pending(self) -> None:
        batch, self._pending = self._pending, []
        await self._send(batch)

    async def _send(self, batch: list[tuple[Hold, dict[str, int], asyncio.Future[None]]]) -> None:
        try:
            results = await self._store.settle_many([(h.hold_id, a) for h, a, _ in batch])
            for (hold, actuals, _), settled in zip(batch, results, strict=True):
                if not settled:
                    await hold.count_late(actuals)
        except Exception as exc:
            self._failures.failed("could not settle a batch of quota holds", exc)
        finally:
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)

    async def drain(self) -> None:
        """Wait for every batch queued or under way (shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class Hold:
    """A live reservation (see the module doc); ``settle`` exactly once."""

    __slots__ = (
        "_batch",
        "_beat",
        "_clock",
        "_extend_until",
        "_failures",
        "_store",
        "_task",
        "amounts",
        "hold_id",
        "hold_ttl",
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
        hold_ttl: float,
        clock: Clock,
        failures: HoldFailures,
        batch: SettleBatch | None = None,
    ) -> None:
        self._store = store
        self._batch = batch
        self.hold_id = hold_id
        self.windows = tuple(windows)
        self.amounts = tuple(amounts)
        self.hold_ttl = hold_ttl
        self._clock = clock
        self._failures = failures
        self.settled = False
        self._task: asyncio.Task[None] | None = None
        self._extend_until = asyncio.get_running_loop().time() + MAX_EXTENDED_SECONDS
        self._beat: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            hold_ttl / 2, self._extend
        )

    def _extend(self) -> None:
        if self.settled or asyncio.get_running_loop().time() > self._extend_until:
            return
        self._task = asyncio.get_running_loop().create_task(self._extended())

    async def _extended(self) -> None:
        try:
            alive = await self._store.extend(self.hold_id, self.hold_ttl)
        except Exception as exc:
            self._failures.failed("could not extend a call's quota hold", exc)
            alive = True  # the store is away: try again, the hold may outlive it
        if alive and not self.settled:
            self._beat = asyncio.get_running_loop().call_later(self.hold_ttl / 2, self._extend)

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
        if self._beat is not None:
            self._beat.cancel()
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
        if self._beat is not None:
            self._beat.cancel()
        try:
            await self._store.release(self.hold_id)
        except Exception as exc:
            self._failures.failed("could not release a call's quota hold", exc)

    async def count_late(self, actuals: dict[str, int]) -> None:
        """The hold is gone (expired): count the call in the windows still open."""
        now = self._clock()
        for window in self.windows:
            if window.resets_at <= now:
                continue
            amount = actuals.get(window.key, 1)
            if amount > 0:
                await self._store.incr(window.key, amount, ttl=window.ttl(now))
