"""Threshold alerts: a project's (or a key's) spend, tokens or requests reached 80 %
or 100 % of a day or month limit.

An alert is raised once per (window bucket, threshold) across every replica: the
replica whose admission first sees the window at or past the threshold claims a
marker in the StateStore (``set_if_absent``, living as long as the bucket) and only
the winner emits. Emitting means two things:

- publish on the EventBus channel ``budgets.alerts`` (every replica's dashboard feed
  hears it; event shape in ``BudgetAlert.event``);
- hand it to this replica's local sinks (``AlertSink``: the project webhooks), so a
  webhook is delivered once, by the replica that won the marker, with no reliance on
  the bus.

Minute windows raise no alert: they fill and empty every minute, and a limit meant
for bursts is not news. Alerts are best effort in one way only: a replica that dies
between claiming the marker and emitting loses that alert (the window's next alert,
at the next threshold or bucket, is unaffected).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol
from uuid import UUID

import structlog

from app.lib.events.base import EventBus
from app.lib.log_budget import RepeatBudget
from app.lib.state.base import StateStore

if TYPE_CHECKING:
    from app.domain.quotas.windows import PlannedWindow

logger = structlog.get_logger()

CHANNEL = "budgets.alerts"

AlertMetric = Literal["cost", "tokens", "requests"]
AlertWindow = Literal["day", "month"]
THRESHOLDS = (80, 100)
"""Percent of the limit at which an alert is raised, lowest first."""
MAX_REMEMBERED = 10_000
"""Markers this replica remembers having settled (won or lost), so that a window
past its threshold costs one store call per replica, not one per call."""


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    alert_id: str
    """Stable for (window bucket, scope, threshold): a receiver may deduplicate on it."""
    project_id: UUID
    credential_id: UUID | None
    """The API key or runtime token whose own limit it is; ``None``: the project's."""
    metric: AlertMetric
    window: AlertWindow
    threshold: int
    """80 or 100 (percent of ``limit``)."""
    used: int
    """What the window held when the alert was raised (micro-units, tokens or
    requests), in-flight reservations included."""
    limit: int
    currency: str | None
    """For ``cost``: the currency of the micro-units; else ``None``."""
    resets_at: datetime.datetime
    at: datetime.datetime

    @property
    def scope(self) -> Literal["project", "key"]:
        return "project" if self.credential_id is None else "key"

    def event(self, origin: str) -> dict[str, object]:
        """The EventBus payload (and the webhook body's ``data``), camelCase."""
        return {
            "kind": "budget_threshold",
            "alertId": self.alert_id,
            "projectId": str(self.project_id),
            "scope": self.scope,
            "credentialId": None if self.credential_id is None else str(self.credential_id),
            "metric": self.metric,
            "window": self.window,
            "threshold": self.threshold,
            "used": self.used,
            "limit": self.limit,
            "currency": self.currency,
            "resetsAt": _iso(self.resets_at),
            "at": _iso(self.at),
            "origin": origin,
        }


class AlertSink(Protocol):
    """A local receiver of the alerts this replica emits (each alert once, platform
    wide). Must not block: queue the work and return. Must not raise."""

    async def alert(self, alert: BudgetAlert) -> None: ...


def _iso(at: datetime.datetime) -> str:
    return at.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


class BudgetAlerts:
    """Raises each threshold alert once (see the module doc). ``observe`` is called by
    the gate with the windows an admission counted in and their counts; it does no
    I/O itself (a task claims and emits), so admission never waits for an alert."""

    def __init__(
        self,
        store: StateStore,
        bus: EventBus,
        *,
        origin: str,
        currency: str = "USD",
        sinks: Sequence[AlertSink] = (),
        log_interval: float = 60.0,
    ) -> None:
        self._store = store
        self._bus = bus
        self.origin = origin
        self._currency = currency
        self.sinks: list[AlertSink] = list(sinks)
        self._seen: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._warnings = RepeatBudget(interval=log_interval)
        self.emitted = 0

    def observe(
        self,
        project_id: UUID,
        windows: Sequence[PlannedWindow],
        counts: Sequence[int],
        now: float,
    ) -> None:
        for window, used in zip(windows, counts, strict=True):
            limit = window.limit
            # Most calls cross nothing: one comparison per window tells.
            if not limit or limit < 0 or used * 100 < limit * _LOWEST or window.name == "minute":
                continue
            threshold = _crossed(used, limit)
            if threshold is None:
                continue
            marker = f"{window.key}|alert:{threshold}"
            if marker in self._seen:
                continue
            self._remember(marker, window.resets_at, now)
            task = asyncio.get_running_loop().create_task(
                self._claim(marker, project_id, window, threshold, used, now)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _remember(self, marker: str, until: float, now: float) -> None:
        if len(self._seen) >= MAX_REMEMBERED:
            self._seen = {m: end for m, end in self._seen.items() if end > now}
            if len(self._seen) >= MAX_REMEMBERED:
                self._seen.clear()  # a marker forgotten costs one more store call
        self._seen[marker] = until

    async def _claim(
        self,
        marker: str,
        project_id: UUID,
        window: PlannedWindow,
        threshold: int,
        used: int,
        now: float,
    ) -> None:
        try:
            ttl = max(1.0, window.ttl(now))
            if not await self._store.set_if_absent(marker, b"1", ttl=ttl):
                return  # another replica (or an earlier call here) raised it
            alert = BudgetAlert(
                alert_id=marker.removeprefix("quota:"),
                project_id=project_id,
                credential_id=window.credential_id,
                metric=window.metric,
                window=window.name,  # type: ignore[arg-type]  # minute windows are skipped
                threshold=threshold,
                used=used,
                limit=window.limit or 0,
                currency=self._currency if window.metric == "cost" else None,
                resets_at=datetime.datetime.fromtimestamp(window.resets_at, datetime.UTC),
                at=datetime.datetime.fromtimestamp(now, datetime.UTC),
            )
            await self.emit(alert)
        except Exception as exc:
            # The marker may be set without an emit: this alert is lost, not repeated.
            self._warn(exc)

    async def emit(self, alert: BudgetAlert) -> None:
        self.emitted += 1
        logger.info(
            "budget threshold reached",
            project_id=str(alert.project_id),
            scope=alert.scope,
            metric=alert.metric,
            window=alert.window,
            threshold=alert.threshold,
        )
        for sink in self.sinks:
            await sink.alert(alert)
        await self._bus.publish(CHANNEL, alert.event(self.origin))

    def _warn(self, exc: Exception) -> None:
        held = self._warnings.admit("alert")
        if held is not None:
            logger.warning("could not raise a budget alert", error=repr(exc), not_logged=held)

    async def drain(self) -> None:
        """Wait for the alerts being claimed or emitted now."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """At shutdown: a second for the alerts under way, then they are dropped."""
        try:
            await asyncio.wait_for(self.drain(), 1.0)
        except TimeoutError:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


_LOWEST = min(THRESHOLDS)


def _crossed(used: int, limit: int) -> int | None:
    """The highest threshold ``used`` is at or past, if any."""
    for threshold in reversed(THRESHOLDS):
        if used * 100 >= limit * threshold:
            return threshold
    return None
