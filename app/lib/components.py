"""How an area declares its wiring, so the server can loop over areas instead of
naming every piece.

A ``Component`` is what one area contributes to a running app: the dependencies it
provides (by name, for the web framework to inject), its background tasks, what it
does at start-up, what it re-syncs after a shared-state outage, and how it stops and
closes. Every hook has a do-nothing default; an area overrides the ones it needs.

The server runs the components of an app in list order for ``start``, ``tasks``,
``ready``, ``seed_after_outage`` and ``resync_after_outage``, and in reverse list order
for ``stop`` and ``aclose`` (what is built on something closes before it). See the
"Wiring" section of ``docs/architecture.md``.

Framework-free: provided values are plain objects; the server wraps them for its
framework (a value that already is a framework provider is used as it is).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from app.lib.tasks import every


@dataclass(frozen=True, slots=True)
class BackgroundTask:
    """A loop run (supervised: restarted after a failure) for the life of the app."""

    name: str
    """The name failures are logged under."""
    run: Callable[[], Awaitable[None]]
    task_name: str | None = None
    """The asyncio task's own name, for tasks that others look up by it."""


def periodic(name: str, seconds: float, body: Callable[[], Awaitable[object]]) -> BackgroundTask:
    """A task that calls ``body`` every ``seconds`` (safety-net reloads, flushes)."""

    async def run() -> None:
        await every(seconds, body)

    return BackgroundTask(name, run)


class Component:
    """One area's wiring; subclasses override the hooks they need."""

    name: str = "component"

    def provides(self) -> Mapping[str, object]:
        """Dependencies by the name handlers ask for them."""
        return {}

    async def start(self) -> None:
        """Before any background task runs and before serving (loads, warm-ups)."""

    def tasks(self) -> Sequence[BackgroundTask]:
        """Started after every component's ``start``, cancelled at shutdown."""
        return ()

    async def ready(self) -> None:
        """After the tasks started, before serving (wait for a first sync)."""

    async def seed_after_outage(self) -> None:
        """The shared state store went away: put into local memory what must hold."""

    async def resync_after_outage(self) -> None:
        """The shared state store is back: reload what lost events would have changed."""

    async def stop(self) -> None:
        """At shutdown, before the background tasks are cancelled."""

    async def aclose(self) -> None:
        """At shutdown, after the background tasks ended."""


def provided(components: Sequence[Component]) -> dict[str, object]:
    """Every component's dependencies; a name provided twice is a wiring mistake."""
    merged: dict[str, object] = {}
    for component in components:
        for name, value in component.provides().items():
            if name in merged:
                raise ValueError(f"dependency {name!r} provided twice ({component.name})")
            merged[name] = value
    return merged


class Provides(Component):
    """An area that only provides dependencies: no tasks, nothing to close."""

    def __init__(self, name: str, values: Mapping[str, object]) -> None:
        self.name = name
        self._values = dict(values)

    def provides(self) -> Mapping[str, object]:
        return self._values
