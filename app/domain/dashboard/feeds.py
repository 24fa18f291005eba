"""The live pages' feeds (see ``stream``): which bus channels each follows and which
fragments it sends.

``/admin/stream/backends`` (channels ``routing.health``, ``routing.config``):

- ``backend-<name>-<cell>``: the content of one live cell of a backend's row
  (``health``, ``breaker``, ``inflight``, ``models``, ``load``), on a health change of
  that backend and on the timer, each only when it changed; the row and its buttons
  are not replaced, so a click in progress is never lost to an update;
- ``backends``: every row (the ``<tbody>``'s content), on connect and when a backend
  was registered, changed or removed on any replica;
- ``backends-clock``: the time of the last update (shows the stream is alive).

``/admin/stream/failover`` (channel ``failover``):

- ``failover-switch``: the latency-failover switch, on connect and on every toggle;
- ``failover-profiles``: each watched profile's status, on a status change and on the
  timer (recent latency);
- ``pins``: the sticky fallback pins (no events of their own: re-read every
  ``PIN_REFRESH_SECONDS``);
- ``failover-clock``: the time of the last update.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import BackendConfig
from app.domain.backends.failover import CHANNEL as FAILOVER_CHANNEL
from app.domain.backends.failover import FailoverControl
from app.domain.backends.sync import CHANNEL as ROUTING_CHANNEL
from app.domain.dashboard.backend_views import (
    BackendView,
    HealthOverlay,
    backend_view,
    backend_views,
    stored_backends,
)
from app.domain.dashboard.failover_views import FailoverOverlay, pin_views, status_views
from app.domain.dashboard.stream import Fragment, SentCache
from app.lib.clock import utcnow
from app.lib.events.base import Event
from app.routing.health import HEALTH_CHANNEL
from app.routing.profiles import ProfileTable
from app.routing.registry import BackendRegistry
from app.routing.vllm_metrics import VllmMetricsCache

Render = Callable[[str, Mapping[str, Any]], str]
"""Renders a template (by name) with a context to a string."""

BACKEND_TICK_SECONDS = 1.0
FAILOVER_TICK_SECONDS = 2.0
PIN_REFRESH_SECONDS = 5.0
ROW_TEMPLATE = "dashboard/partials/backend_row.html"
CELL_TEMPLATE = "dashboard/partials/backend_cell.html"
LIVE_CELLS = ("health", "breaker", "inflight", "models", "load")
EMPTY_ROWS_TEMPLATE = "dashboard/partials/backend_empty.html"
CLOCK_TEMPLATE = "dashboard/partials/clock.html"


def cell_event(name: str, cell: str) -> str:
    return f"backend-{name}-{cell}"


def _clock(render: Render) -> str:
    return render(CLOCK_TEMPLATE, {"now": utcnow()})


class BackendsFeed:
    channels: tuple[str, ...] = (HEALTH_CHANNEL, ROUTING_CHANNEL)
    tick_seconds = BACKEND_TICK_SECONDS

    def __init__(
        self,
        *,
        db_config: SQLAlchemyAsyncConfig,
        registry: BackendRegistry,
        metrics: VllmMetricsCache,
        render: Render,
    ) -> None:
        self._db_config = db_config
        self._registry = registry
        self._metrics = metrics
        self._render = render
        self._rows: list[BackendConfig] = []
        self._overlay = HealthOverlay()
        self._sent = SentCache()

    def _cells(self, view: BackendView) -> list[Fragment]:
        return [
            (cell_event(view.name, cell), self._render(CELL_TEMPLATE, {"b": view, "cell": cell}))
            for cell in LIVE_CELLS
        ]

    async def _table(self) -> list[Fragment]:
        self._rows = await stored_backends(self._db_config)
        self._overlay.forget_others({row.name for row in self._rows})
        views = await backend_views(self._rows, self._registry, self._metrics, self._overlay)
        for view in views:
            self._sent.record(self._cells(view))
        rows = [self._render(ROW_TEMPLATE, {"b": view}) for view in views]
        body = "\n".join(rows) or self._render(EMPTY_ROWS_TEMPLATE, {})
        # The table as a whole is never deduplicated: cells sent one by one since the
        # last table make its last HTML a poor guide to what the page shows.
        return [("backends", body), ("backends-clock", _clock(self._render))]

    async def snapshot(self) -> list[Fragment]:
        return await self._table()

    async def on_event(self, event: Event) -> list[Fragment]:
        if event.get("channel") == ROUTING_CHANNEL:
            return await self._table()
        name = self._overlay.note(event)
        row = next((r for r in self._rows if r.name == name), None)
        if row is None:
            # Registered on another replica a moment ago, or not ours to show.
            return await self._table() if name is not None else []
        view = await backend_view(row, self._registry, self._metrics, self._overlay)
        return self._sent.changed(self._cells(view))

    async def on_tick(self) -> list[Fragment]:
        views = await backend_views(self._rows, self._registry, self._metrics, self._overlay)
        changed = self._sent.changed(f for view in views for f in self._cells(view))
        return [*changed, ("backends-clock", _clock(self._render))]


class FailoverFeed:
    channels: tuple[str, ...] = (FAILOVER_CHANNEL,)
    tick_seconds = FAILOVER_TICK_SECONDS

    def __init__(
        self,
        *,
        db_config: SQLAlchemyAsyncConfig,
        control: FailoverControl,
        profiles: ProfileTable,
        render: Render,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db_config = db_config
        self._control = control
        self._profiles = profiles
        self._render = render
        self._clock = clock
        self._overlay = FailoverOverlay(control.origin)
        self._sent = SentCache()
        self._pins_read_at = 0.0

    def _switch(self, enabled: bool) -> Fragment:
        html = self._render("dashboard/partials/failover_switch.html", {"enabled": enabled})
        return "failover-switch", html

    def _statuses(self) -> tuple[bool, Fragment]:
        enabled, views = status_views(self._control, self._profiles, self._overlay)
        html = self._render("dashboard/partials/failover_rows.html", {"statuses": views})
        return enabled, ("failover-profiles", html)

    async def _pins(self) -> Fragment:
        pins, total = await pin_views(self._db_config)
        self._pins_read_at = self._clock()
        html = self._render("dashboard/partials/pin_rows.html", {"pins": pins, "total": total})
        return "pins", html

    async def snapshot(self) -> list[Fragment]:
        enabled, statuses = self._statuses()
        fragments = [self._switch(enabled), statuses, await self._pins()]
        self._sent.record(fragments)
        return [*fragments, ("failover-clock", _clock(self._render))]

    async def on_event(self, event: Event) -> list[Fragment]:
        if event.get("kind") == "switch" and isinstance(event.get("enabled"), bool):
            # The event's value, not the policy's: another replica's toggle reaches
            # this replica's policy a moment later (FailoverControl.run).
            _, statuses = self._statuses()
            return self._sent.changed([self._switch(bool(event["enabled"])), statuses])
        self._overlay.note(event)
        _, statuses = self._statuses()
        return self._sent.changed([statuses])

    async def on_tick(self) -> list[Fragment]:
        _, statuses = self._statuses()
        fragments = [statuses]
        if self._clock() - self._pins_read_at >= PIN_REFRESH_SECONDS:
            fragments.append(await self._pins())
        return [*self._sent.changed(fragments), ("failover-clock", _clock(self._render))]
