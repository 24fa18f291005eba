"""Replicas tell each other what they sent each backend, so every estimate counts all.

Each replica counts the requests it sends to every backend and the ones that end
(``BackendLoad``). Whenever those change, it publishes its totals on ``routing.load``:
at once after a quiet spell, then at most one event per ``flush_seconds`` while
changes keep coming (none while idle); every other replica keeps the latest totals
per origin and adds them to its own. With one more replica sending, a reading is still
corrected by all the requests sent and ended since it was taken, not by a third of
them.

Totals are absolute, so a lost event is made good by the next one. A replica that
stops leaves its last totals behind; they no longer change, so they add nothing to
what has happened since any reading.

Event shape::

    {"origin": "<replica>", "loads": [["<backend>", "<upstream>", sent, ended], ...]}
"""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from typing import Any

import structlog

from app.lib.events.base import Event, EventBus
from app.routing.load import Counts
from app.routing.registry import BackendRegistry, BackendState
from app.routing.replicas import follow_others, tell_others

LOAD_CHANNEL = "routing.load"
DEFAULT_FLUSH_SECONDS = 0.01

logger = structlog.get_logger()


@dataclass(slots=True, eq=False)
class LoadShare:
    registry: BackendRegistry
    events: EventBus
    _: KW_ONLY
    instance: str
    flush_seconds: float = DEFAULT_FLUSH_SECONDS
    _dirty: dict[str, BackendState] = field(default_factory=dict, init=False)
    _timer: asyncio.TimerHandle | None = field(default=None, init=False)
    _sending: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _last_flush: float = field(default=float("-inf"), init=False)

    def watch(self) -> None:
        """Track every backend as it is added or replaced."""
        self.registry.on_added(self.track)

    def track(self, state: BackendState) -> None:
        state.load.listener = partial(self._changed, state)

    def _changed(self, state: BackendState) -> None:
        self._dirty[state.name] = state
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # counted outside the app's loop (a test): nothing to send it on
            # Leading edge: a change after a quiet spell goes out at once (another
            # replica's next pick must see it), later ones wait for the interval's end,
            # so a burst costs one event per ``flush_seconds``.
            wait = self._last_flush + self.flush_seconds - loop.time()
            self._timer = loop.call_later(max(0.0, wait), self._flush)

    def _flush(self) -> None:
        self._timer = None
        self._last_flush = asyncio.get_running_loop().time()
        dirty, self._dirty = self._dirty, {}
        loads = [
            [state.name, state.upstream, state.load.sent, state.load.ended]
            for state in dirty.values()
        ]
        task = asyncio.get_running_loop().create_task(self._publish(loads))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish(self, loads: list[list[Any]]) -> None:
        try:
            await tell_others(self.events, LOAD_CHANNEL, self.instance, loads=loads)
        except Exception as exc:  # counts are hints: the next change sends them again
            logger.warning("could not share backend load", error=repr(exc))

    async def follow(self) -> None:
        """Apply the totals other replicas publish (run supervised)."""
        await follow_others(self.events, LOAD_CHANNEL, self.instance, self._apply)

    def _apply(self, event: Event) -> None:
        origin, loads = event.get("origin"), event.get("loads")
        if not isinstance(origin, str):
            return
        if not isinstance(loads, list):
            logger.warning("malformed backend load", loads=loads)
            return
        for item in loads:
            try:
                name, upstream, sent, ended = str(item[0]), str(item[1]), int(item[2]), int(item[3])
            except (TypeError, ValueError, IndexError):
                continue
            state = self.registry.get(name)
            if state is not None and state.upstream == upstream:
                state.load.remote(origin, Counts(sent, ended))

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
