"""Per-backend circuit breaker.

Closed until ``threshold`` consecutive failures; then open for ``open_seconds``; then
half-open, admitting exactly one trial call: its success closes the breaker, its
failure reopens it for another ``open_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from app.routing.types import Clock, monotonic

DEFAULT_THRESHOLD = 3
DEFAULT_OPEN_SECONDS = 30.0


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True, eq=False, kw_only=True)
class CircuitBreaker:
    threshold: int = DEFAULT_THRESHOLD
    open_seconds: float = DEFAULT_OPEN_SECONDS
    clock: Clock = monotonic
    _failures: int = field(default=0, init=False)
    _opened_at: float | None = field(default=None, init=False)
    _trial_out: bool = field(default=False, init=False)

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self.clock() - self._opened_at < self.open_seconds:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def can_accept(self) -> bool:
        """Whether a call could be admitted now (no side effect; used for filtering)."""
        state = self.state
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and not self._trial_out
        )

    def acquire(self) -> bool:
        """Admit a call; in half-open state only the first caller gets the trial."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._trial_out:
            self._trial_out = True
            return True
        return False

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial_out = False

    def record_failure(self) -> None:
        if self._trial_out or self._opened_at is not None:
            # The half-open trial failed (or a call admitted before opening did): reopen.
            self._opened_at = self.clock()
            self._trial_out = False
            return
        self._failures += 1
        if self._failures >= self.threshold:
            self._opened_at = self.clock()

    def release(self) -> None:
        """Give back a trial that ended without a verdict (client went away)."""
        self._trial_out = False

    def open_remaining(self) -> float:
        """Seconds the breaker stays open (0 when closed or half-open)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self.open_seconds - (self.clock() - self._opened_at))

    def trip(self, remaining: float) -> None:
        """Open for ``remaining`` seconds on another replica's verdict: the same state
        this breaker would be in had it counted the failures itself."""
        self._failures = max(self._failures, self.threshold)
        self._opened_at = self.clock() - max(0.0, self.open_seconds - remaining)
        self._trial_out = False
