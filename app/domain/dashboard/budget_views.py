"""What the budgets page shows, and its live feed (``/admin/stream/budgets``).

The rows are the ``AlertHistory``'s newest alerts (of one project with ``?project=``),
with the names of their projects and keys read in one query per table, not per row.
The feed follows ``budgets.alerts``: an event is merged into what the history holds
(this replica's recorder may not have written it yet when the stream hears it) and
the rows go out when their HTML changed. A slow timer re-renders them too, so "3 min
ago" keeps up (the stream also ends every minute and reconnects with a snapshot).
Fragments:

- ``budget-alerts``: the rows, newest first;
- ``budgets-clock``: the time of the last update.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import ApiKey, RuntimeToken
from app.domain.dashboard.budget_alerts import AlertEntry, AlertHistory, newest_first, parse_alert
from app.domain.dashboard.feeds import Render
from app.domain.dashboard.stream import Fragment, SentCache
from app.domain.prices.amounts import text as money_text
from app.domain.projects.services import ProjectService
from app.domain.quotas.alerts import CHANNEL as ALERTS_CHANNEL
from app.lib.clock import utcnow
from app.lib.events.base import Event

ROWS_TEMPLATE = "dashboard/partials/budget_rows.html"
CLOCK_TEMPLATE = "dashboard/partials/clock.html"
TICK_SECONDS = 30.0
DELETED = "(deleted project)"
_METRICS = {"cost": "spend", "tokens": "tokens", "requests": "requests"}


@dataclass(frozen=True, slots=True)
class AlertView:
    entry: AlertEntry
    project_name: str
    key_label: str
    """For a key's own limit: "API key <name>", "runtime token <name>", or the id of a
    key deleted since; empty for the project's limit."""
    now: datetime.datetime

    @property
    def reached(self) -> bool:
        return self.entry.threshold >= 100

    @property
    def tone(self) -> str:
        return "bad" if self.reached else "warn"

    @property
    def what(self) -> str:
        """``spend per day``, ``tokens per month``."""
        return f"{_METRICS[self.entry.metric]} per {self.entry.window}"

    @property
    def used(self) -> str:
        return self._amount(self.entry.used)

    @property
    def limit(self) -> str:
        return self._amount(self.entry.limit)

    @property
    def percent(self) -> int:
        return self.entry.used * 100 // self.entry.limit if self.entry.limit else 0

    @property
    def ago(self) -> str:
        return relative(self.entry.at, self.now)

    @property
    def resets_in(self) -> str:
        return relative(self.entry.resets_at, self.now)

    def _amount(self, value: int) -> str:
        if self.entry.metric == "cost":
            # Micro-units: exact decimal text, then the currency.
            return f"{money_text(value)} {self.entry.currency or ''}".rstrip()
        return f"{value:,}"


def relative(at: datetime.datetime, now: datetime.datetime) -> str:
    """``5 min ago`` / ``in 3 h``: rough on purpose, the exact time stands beside it."""
    seconds = (at - now).total_seconds()
    span = abs(seconds)
    if span < 60:
        return "just now" if seconds <= 0 else "in under a minute"
    for unit, size in (("day", 86_400), ("h", 3_600), ("min", 60)):
        if span >= size:
            count = int(span // size)
            amount = f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''}"
            return f"{amount} ago" if seconds < 0 else f"in {amount}"
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(slots=True)
class NameBook:
    """Names of projects and keys, read for the ids not already known (a feed keeps
    one for the life of its stream)."""

    db_config: SQLAlchemyAsyncConfig
    projects: dict[UUID, str] = field(default_factory=dict)
    keys: dict[UUID, str] = field(default_factory=dict)

    async def learn(self, entries: Iterable[AlertEntry], projects: Iterable[UUID] = ()) -> None:
        """Read the names of these alerts' projects and keys (and of ``projects``)."""
        entries = list(entries)
        unknown = {*projects, *(e.project_id for e in entries)} - self.projects.keys()
        keys = {e.credential_id for e in entries if e.credential_id} - self.keys.keys()
        if not unknown and not keys:
            return
        async with self.db_config.get_session() as session:
            names = await ProjectService(session=session).names_of(unknown)
            self.projects.update({pid: names.get(pid, DELETED) for pid in unknown})
            self.keys.update(await _key_labels(session, keys))

    def view(self, entry: AlertEntry, now: datetime.datetime) -> AlertView:
        key = ""
        if entry.credential_id is not None:
            key = self.keys.get(entry.credential_id) or f"key {entry.credential_id}"
        return AlertView(entry, self.projects.get(entry.project_id, DELETED), key, now)


async def _key_labels(session: AsyncSession, ids: Collection[UUID]) -> dict[UUID, str]:
    """ "API key <name>" or "runtime token <name>" by id: one query per table."""
    if not ids:
        return {}
    labels: dict[UUID, str] = {}
    for model, kind in ((ApiKey, "API key"), (RuntimeToken, "runtime token")):
        rows = await session.execute(select(model.id, model.name).where(model.id.in_(ids)))
        labels.update({row.id: f"{kind} {row.name}".rstrip() for row in rows})
    return labels


async def alert_views(
    history: AlertHistory,
    names: NameBook,
    project_id: UUID | None = None,
    extra: AlertEntry | None = None,
) -> list[AlertView]:
    """The newest alerts (of one project), with names; ``extra``: one just heard."""
    entries = await history.recent(project_id)
    if extra is not None and (project_id is None or extra.project_id == project_id):
        entries = newest_first([extra, *entries])
    await names.learn(entries)
    now = utcnow()
    return [names.view(entry, now) for entry in entries]


class BudgetsFeed:
    channels: tuple[str, ...] = (ALERTS_CHANNEL,)
    tick_seconds = TICK_SECONDS

    def __init__(
        self,
        *,
        history: AlertHistory,
        db_config: SQLAlchemyAsyncConfig,
        render: Render,
        project_id: UUID | None = None,
    ) -> None:
        self._history = history
        self._names = NameBook(db_config)
        self._render = render
        self._project_id = project_id
        self._sent = SentCache()

    async def _rows(self, extra: AlertEntry | None = None) -> Fragment:
        views = await alert_views(self._history, self._names, self._project_id, extra)
        filtered = self._project_id is not None
        return "budget-alerts", self._render(ROWS_TEMPLATE, {"alerts": views, "filtered": filtered})

    def _clock(self) -> Fragment:
        return "budgets-clock", self._render(CLOCK_TEMPLATE, {"now": utcnow()})

    async def snapshot(self) -> list[Fragment]:
        rows = await self._rows()
        self._sent.record([rows])
        return [rows, self._clock()]

    async def on_event(self, event: Event) -> list[Fragment]:
        entry = parse_alert(event)
        if entry is None or self._project_id not in (None, entry.project_id):
            return []
        changed = self._sent.changed([await self._rows(entry)])
        return [*changed, self._clock()] if changed else []

    async def on_tick(self) -> list[Fragment]:
        return [*self._sent.changed([await self._rows()]), self._clock()]
