"""``WebhookDispatcher``: the alert sink that delivers threshold events to project
webhooks, and the worker that does it.

``alert()`` runs on the admission path of the call that crossed a threshold: it only
appends the alert to an in-memory queue and wakes the worker, writing nothing. The
worker (one background task per replica):

1. writes a delivery row per enabled webhook of the alert's project that takes
   threshold events (``DeliveryStore.enqueue_alert``); an alert still queued when the
   database is down stays queued (bounded) and is written when it is back;
2. claims due rows (its own new ones, retries that came due, rows a dead replica let
   go) and attempts each in a task of its own, at most ``max_in_flight`` at once;
3. sleeps until the earliest pending row is due, or until woken (a new alert, an
   attempt that ended, a retry asked for by hand), or ``SAFETY_NET_SECONDS`` at most
   (rows other replicas scheduled): nothing is polled while nothing is pending.

Each attempt signs the stored body afresh (``signing``), POSTs it through the guarded
pool and records the outcome on the row: delivered on a 2xx; otherwise due again
after the retry schedule's wait, or failed once the attempts are spent (or at once
when the address policy refuses the receiver: retrying cannot help). Delivery is at
least once: a replica that dies mid-attempt leaves the row to be taken again when
its lease ends, so receivers deduplicate on the body's ``id`` (the delivery) or
``data.alertId``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

import msgspec
import structlog

from app.domain.quotas.alerts import BudgetAlert
from app.domain.webhooks import signing
from app.domain.webhooks.sender import AttemptResult, WebhookSender
from app.domain.webhooks.store import (
    DELIVERED,
    EVENT_TEST,
    FAILED,
    PENDING,
    Claimed,
    DeliveryStore,
    Outcome,
    Target,
    iso,
)
from app.lib.clock import utcnow
from app.lib.log_budget import RepeatBudget

logger = structlog.get_logger()

SAFETY_NET_SECONDS = 60.0
"""Longest sleep: rows scheduled by another replica that died are found within it."""
ERROR_PAUSE_SECONDS = 5.0
"""After a failed database step (an outage) before the worker tries again."""
LOCKED_PAUSE_SECONDS = 0.1
"""Due rows another replica is claiming right now: look again shortly, do not spin."""
MAX_QUEUED_ALERTS = 10_000
STOP_GRACE_SECONDS = 2.0
"""At shutdown, how long attempts under way may finish before they are cut."""
RETENTION = datetime.timedelta(days=30)
"""Delivered and failed rows are deleted this long after they were created."""
PRUNE_SECONDS = 3600.0

SecretsFor = Callable[[UUID, Target, datetime.datetime], list[str]]
"""The secrets that sign an attempt to a webhook now (current first); raises when a
stored secret cannot be opened on this server."""


@dataclass(frozen=True, slots=True)
class RetrySchedule:
    max_attempts: int
    base_seconds: float
    factor: float = 4.0
    jitter: float = 0.2
    """Each wait is scaled by a random factor in [1 - jitter, 1 + jitter], so the
    retries of many deliveries that failed together (a receiver outage) spread out."""

    def attempts_for(self, event: str) -> int:
        # A test event is one attempt: its result is shown at once; retry it by hand.
        return 1 if event == EVENT_TEST else self.max_attempts

    def wait_after(self, attempts: int) -> float:
        """Seconds between attempt ``attempts`` (failed) and the next one."""
        nominal = self.base_seconds * self.factor ** max(0, attempts - 1)
        return nominal * random.uniform(1 - self.jitter, 1 + self.jitter)  # noqa: S311


class WebhookDispatcher:
    """Implements ``app.domain.quotas.alerts.AlertSink`` (see the module doc)."""

    def __init__(
        self,
        store: DeliveryStore,
        sender: WebhookSender,
        secrets_for: SecretsFor,
        schedule: RetrySchedule,
        *,
        origin: str,
        max_in_flight: int = 8,
        clock: Callable[[], datetime.datetime] = utcnow,
    ) -> None:
        self._store = store
        self._sender = sender
        self._secrets_for = secrets_for
        self.schedule = schedule
        self._origin = origin
        self._max_in_flight = max_in_flight
        self._clock = clock
        self._alerts: deque[BudgetAlert] = deque()
        self._wake = asyncio.Event()
        self._active: dict[UUID, asyncio.Task[None]] = {}
        self._stopping = False
        self._log_budget = RepeatBudget(interval=60.0)
        self.dropped_alerts = 0
        """Alerts refused because the queue was full (a long database outage)."""
        self.results: Counter[str] = Counter()
        """Attempts made, by result: delivered, retry, failed (``metrics.py``)."""

    @property
    def lease(self) -> datetime.timedelta:
        """How long a claimed row stays this replica's: an attempt's deadline with room
        for the writes around it."""
        return datetime.timedelta(seconds=2 * self._sender.timeout + 30)

    # ------------------------------------------------------------ the sink

    async def alert(self, alert: BudgetAlert) -> None:
        """Queue ``alert`` for the worker and return; never blocks, never raises."""
        try:
            if len(self._alerts) >= MAX_QUEUED_ALERTS:
                self.dropped_alerts += 1
                self._warn("webhook alert queue full; alert dropped", alert_id=alert.alert_id)
                return
            self._alerts.append(alert)
            self._wake.set()
        except Exception as exc:  # the caller is admitting a call: never fail it
            self._warn("could not queue a webhook alert", error=repr(exc))

    def wake(self) -> None:
        self._wake.set()

    @property
    def queued(self) -> int:
        return len(self._alerts)

    # ------------------------------------------------------------ by hand

    async def send_test(self, webhook_id: UUID, project_id: UUID) -> UUID:
        """A ``webhook.test`` delivery, attempted now; its id once the attempt ended."""
        now = self._clock()
        data: dict[str, object] = {
            "kind": "test",
            "projectId": str(project_id),
            "webhookId": str(webhook_id),
            "at": iso(now),
            "origin": self._origin,
        }
        claimed = await self._store.insert_claimed(
            webhook_id, EVENT_TEST, data, now, now + self.lease
        )
        await self._attempt_now(claimed)
        return claimed.id

    async def retry(self, delivery_id: UUID) -> bool:
        """One more attempt of a failed delivery, now; False when it is not failed."""
        now = self._clock()
        claimed = await self._store.claim_failed(delivery_id, now, now + self.lease)
        if claimed is None:
            return False
        await self._attempt_now(claimed)
        return True

    async def _attempt_now(self, claimed: Claimed) -> None:
        # Its own task, so a client that goes away does not cut the attempt short
        # (the row would then wait for its lease to end).
        task = self._spawn(claimed)
        await asyncio.shield(task)

    # ------------------------------------------------------------ the worker

    async def run(self) -> None:
        """The worker loop (a supervised background task)."""
        while True:
            if self._stopping:
                await asyncio.Future()  # until cancelled: ``stop`` gave the rows back
            self._wake.clear()
            try:
                delay = await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away: the rows wait for it
                self._warn("webhook dispatcher step failed", error=repr(exc))
                delay = ERROR_PAUSE_SECONDS
            if delay > 0:
                # Not ``wait_for``: on 3.11 it can swallow a cancellation that arrives
                # as the event is set (``stop`` then cancel), leaving the task running.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    async def _step(self) -> float:
        """Write queued alerts, start due attempts; seconds to sleep after."""
        while self._alerts:
            await self._store.enqueue_alert(self._alerts[0], self._origin, self._clock())
            self._alerts.popleft()
        room = self._max_in_flight - len(self._active)
        if room <= 0:
            return SAFETY_NET_SECONDS  # an attempt that ends wakes the loop
        now = self._clock()
        claimed = await self._store.claim_due(now, now + self.lease, room)
        if self._stopping:  # ``stop`` ran meanwhile: these are the next process's
            await self._store.release([row.id for row in claimed], self._clock())
            return SAFETY_NET_SECONDS
        for row in claimed:
            self._spawn(row)
        if len(claimed) == room:
            return 0.0  # maybe more are due
        due = await self._store.next_due()
        if due is None:
            return SAFETY_NET_SECONDS
        wait = (due - self._clock()).total_seconds()
        if wait <= 0:
            # Due but not ours to take: claimed by another replica this instant.
            return LOCKED_PAUSE_SECONDS
        return min(wait, SAFETY_NET_SECONDS)

    def _spawn(self, claimed: Claimed) -> asyncio.Task[None]:
        task = asyncio.create_task(self._attempt(claimed), name=f"webhook-{claimed.id}")
        self._active[claimed.id] = task

        def done(_: asyncio.Task[None]) -> None:
            self._active.pop(claimed.id, None)
            self._wake.set()

        task.add_done_callback(done)
        return task

    async def _attempt(self, claimed: Claimed) -> None:
        try:
            target = await self._store.target(claimed.webhook_id)
            if target is None:
                return  # the webhook was deleted, and its deliveries with it
            result = await self._send(claimed, target)
            now = self._clock()
            outcome = self._outcome(claimed, result, now)
            self.results["retry" if outcome.status == PENDING else outcome.status] += 1
            if not await self._store.record(claimed, outcome, now):
                logger.info("webhook attempt outlived its lease", delivery_id=str(claimed.id))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the row comes back when its lease ends
            self._warn("webhook attempt could not be recorded", error=repr(exc))

    async def _send(self, claimed: Claimed, target: Target) -> AttemptResult:
        if not target.enabled and claimed.event != EVENT_TEST:
            return AttemptResult(None, "the webhook is disabled", None, 0, permanent=True)
        try:
            keys = self._secrets_for(claimed.webhook_id, target, self._clock())
        except Exception as exc:
            logger.error(
                "webhook signing secret cannot be opened",
                webhook_id=str(claimed.webhook_id),
                error=str(exc),
            )
            message = "the signing secret cannot be read on this server (vault keys)"
            return AttemptResult(None, message, None, 0)
        body = msgspec.json.encode(claimed.payload)
        headers = {
            signing.SIGNATURE_HEADER: signing.signature_header(keys, int(time.time()), body),
            signing.EVENT_HEADER: claimed.event,
            signing.DELIVERY_HEADER: str(claimed.id),
            signing.ATTEMPT_HEADER: str(claimed.attempts),
        }
        return await self._sender.post(target.url, body, headers)

    def _outcome(self, claimed: Claimed, result: AttemptResult, now: datetime.datetime) -> Outcome:
        entry: dict[str, object] = {
            "at": iso(now),
            "statusCode": result.status_code,
            "error": result.error,
            "durationMs": result.duration_ms,
        }
        if result.delivered:
            status, due = DELIVERED, None
        elif result.permanent or claimed.attempts >= self.schedule.attempts_for(claimed.event):
            status, due = FAILED, None
        else:
            wait = self.schedule.wait_after(claimed.attempts)
            status, due = PENDING, now + datetime.timedelta(seconds=wait)
        return Outcome(status, result.status_code, result.error, result.response, due, entry)

    # ------------------------------------------------------------ shutdown

    async def stop(self) -> None:
        """Write the alerts still queued, let attempts under way end (briefly), and
        give back the rows still held so the next start (any replica) takes them."""
        self._stopping = True
        self._wake.set()
        try:
            while self._alerts:
                await self._store.enqueue_alert(self._alerts[0], self._origin, self._clock())
                self._alerts.popleft()
        except Exception as exc:
            logger.warning(
                "webhook alerts lost at shutdown", count=len(self._alerts), error=repr(exc)
            )
        if self._active:
            await asyncio.wait(list(self._active.values()), timeout=STOP_GRACE_SECONDS)
        held = list(self._active)
        for task in list(self._active.values()):
            task.cancel()
        try:
            await self._store.release(held, self._clock())
        except Exception as exc:  # their leases run out instead
            logger.warning("could not release webhook deliveries", error=repr(exc))

    async def aclose(self) -> None:
        await self._sender.aclose()

    async def prune(self) -> None:
        """Keep the log bounded (a periodic task; every replica may run it)."""
        deleted = await self._store.prune(self._clock() - RETENTION)
        if deleted:
            logger.info("old webhook deliveries deleted", count=deleted)

    def _warn(self, message: str, **fields: object) -> None:
        held_back = self._log_budget.admit(message)
        if held_back is not None:
            logger.warning(message, held_back=held_back, **fields)
