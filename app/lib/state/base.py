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
        ``limit``. The window starts at the first admission and lasts ``window`` seconds."""
        ...

    async def push_sample(self, key: str, value: float, max_samples: int) -> None:
        """Append to a bounded list of recent samples (latency tracking)."""
        ...

    async def samples(self, key: str) -> list[float]: ...

    async def ping(self) -> bool:
        """True when the store is reachable."""
        ...

    async def close(self) -> None: ...
