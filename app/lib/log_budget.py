"""Logging that stays cheap when the same thing goes wrong a thousand times a second.

A failing upstream turns every request into a 5xx. One line per failed request adds a
formatted line and a ``write`` syscall to each (measured: about a tenth of a success's
CPU), floods the log a person reads, and tells them nothing the first line did not.
``RepeatBudget`` lets the first occurrence of a kind through at once and then counts
repeats, letting one line per interval through that carries how many were held back.
Exact counts belong in metrics (``/metrics`` counts every request by route and status);
the log says that something is failing and how often.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Window:
    opened: float
    held_back: int = 0


@dataclass(slots=True)
class RepeatBudget:
    """At most one line per key and ``interval`` seconds; the rest are counted.

    Keys must come from a bounded set (a route template and a status, never user
    input); ``max_keys`` is the guard if they do not: past it the windows start over,
    which only lets a few more lines through.
    """

    interval: float = 10.0
    max_keys: int = 1024
    clock: Callable[[], float] = time.monotonic
    _windows: dict[Hashable, _Window] = field(default_factory=dict, init=False)

    def admit(self, key: Hashable) -> int | None:
        """``None`` when this occurrence is only counted, else how many like it were
        held back since the last line (0 for the first one)."""
        now = self.clock()
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self.max_keys:
                self._windows.clear()
            self._windows[key] = _Window(now)
            return 0
        if now - window.opened < self.interval:
            window.held_back += 1
            return None
        held_back = window.held_back
        window.opened = now
        window.held_back = 0
        return held_back
