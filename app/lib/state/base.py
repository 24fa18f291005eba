"""The ``StateStore`` interface: hot, shared, short-lived state.

Pins, breaker/cooldown state, quota counters, rate windows, latency samples and
revocation marks live here. The in-memory implementation serves a single process;
the Redis implementation makes every replica see the same state, with each
operation atomic (single command or Lua script) so that concurrent replicas
never over-admit.

Keys are plain strings; implementations add their own namespace prefix.
Values are bytes (callers encode with msgspec).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class WindowDecision:
    """Outcome of a fixed-window admission (rate limit or quota)."""

    allowed: bool
    current: int
    """Units counted in the window after this call (unchanged when refused)."""
    limit: int
    retry_after: float
    """Seconds until the window resets (0 when allowed)."""


@dataclass(frozen=True, slots=True)
class WindowLimit:
    """One window of a multi-window admission (``StateStore.admit_windows``)."""

    key: str
    limit: int | None
    """Most units the window may hold; ``None`` counts without a limit."""
    ttl: float
    """Seconds the window lasts, counted from the admission that creates its key."""


@dataclass(frozen=True, slots=True)
class WindowCount:
    """One window's side of a multi-window decision."""

    key: str
    fits: bool
    """The window alone had room for the amount."""
    current: int
    """Units in the window after the call (unchanged when the admission was refused)."""
    limit: int | None
    retry_after: float
    """Seconds until the window resets when it had no room, else 0."""


@dataclass(frozen=True, slots=True)
class MultiWindowDecision:
    """Outcome of ``StateStore.admit_windows``: all windows counted, or none."""

    allowed: bool
    windows: tuple[WindowCount, ...]
    """In the order the windows were given."""

    @property
    def full(self) -> tuple[WindowCount, ...]:
        """The windows that had no room (empty when allowed)."""
        return tuple(w for w in self.windows if not w.fits)


def check_windows(windows: Sequence[WindowLimit], amount: int) -> None:
    """The argument checks both implementations make before ``admit_windows``."""
    if amount < 1:
        raise ValueError(f"amount must be at least 1, got {amount}")
    keys = set()
    for window in windows:
        if window.ttl <= 0:
            raise ValueError(f"ttl must be positive, got {window.ttl}")
        if window.limit is not None and window.limit < 0:
            raise ValueError(f"limit must be None or at least 0, got {window.limit}")
        if window.key in keys:
            raise ValueError(f"window key {window.key!r} given twice")
        keys.add(window.key)


def check_max_samples(max_samples: int) -> None:
    """The argument check both implementations make before ``push_sample``."""
    if max_samples < 1:
        raise ValueError(f"max_samples must be at least 1, got {max_samples}")


@runtime_checkable
class StateStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None: ...

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        """Set only when the key does not exist (leases, first-writer-wins pins)."""
        ...

    async def delete(self, key: str) -> bool: ...

    async def exists(self, key: str) -> bool: ...

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        """Atomically add ``amount``; ``ttl`` applies only when the key is created."""
        ...

    async def admit(self, key: str, amount: int, limit: int, window: float) -> WindowDecision:
        """Atomically add ``amount`` to the fixed window at ``key`` unless that would exceed
        ``limit``. The window starts at the first admission and lasts ``window`` seconds.

        For rate limits that tolerate a per-replica count during a Redis outage (login
        throttling); exact quotas use ``admit_windows``, which never falls back."""
        ...

    async def admit_windows(
        self, windows: Sequence[WindowLimit], amount: int = 1
    ) -> MultiWindowDecision:
        """Atomically add ``amount`` to every window, or to none of them.

        When each window has room (``current + amount <= limit``; a ``None`` limit
        always has room) all are incremented in one step; otherwise nothing changes
        and the refusal says which windows were full. Each window starts when its key
        is created and lasts its ``ttl``, like ``admit``; a key left without expiry is
        given one. No caller can observe or interleave with a partial update, so
        concurrent callers (on any replica) never push a window past its limit.
        ``amount`` must be positive and keys distinct; no windows: allowed, no call.
        """
        ...

    async def push_sample(self, key: str, value: float, max_samples: int) -> None:
        """Append to a bounded list of recent samples (latency tracking)."""
        ...

    async def samples(self, key: str) -> list[float]: ...

    async def ping(self) -> bool:
        """True when the store is reachable."""
        ...

    async def close(self) -> None: ...
