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

import datetime
from dataclasses import dataclass
from typing import Literal, Protocol
from uuid import UUID

CHANNEL = "budgets.alerts"

AlertMetric = Literal["cost", "tokens", "requests"]
AlertWindow = Literal["day", "month"]
THRESHOLDS = (80, 100)
"""Percent of the limit at which an alert is raised, lowest first."""


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
