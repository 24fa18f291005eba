"""A ``StateStore`` that rides out a Redis outage on this process's own memory.

While the shared store answers, every call goes to it. When a call fails for want of
Redis (connection refused or reset, timeouts), the store is marked degraded and that
call, and every call after it, is served from a local ``MemoryStateStore``: pins,
breaker verdicts, web sessions and rate windows keep working per replica instead of
failing every request. A watcher pings Redis meanwhile (requests never pay for the
probing) and switches back when it answers, dropping what the local memory held.

Two things are deliberately not served locally:

- quota admission (``admit_windows``) raises ``StateStoreUnavailableError`` instead: a
  count kept per replica would let N replicas admit N times the limit, so each
  project's own policy decides (``QuotaGate``: fail open or fail closed). Plain
  ``admit`` (login throttling) does fall back: N replicas allowing N times the attempts
  for the outage still bounds a password guesser, and refusing every login would lock
  everyone out of the console;
- reservations (``reserve``, ``settle``, ``release``, ``extend``, ``window_total``)
  raise the same error, for the same reason: a hold is an exact-quota admission.
  Settling or releasing a hold taken on Redis cannot be done elsewhere either; if Redis
  comes back with its data, the hold expires after its TTL and gives its units back
  (the call's actual usage then goes uncounted in the windows), and if it comes back
  empty, the windows start afresh anyway. A ``reserve`` whose reply was lost (timeout)
  may have recorded its hold: the caller can ``release`` it later (it is idempotent)
  or let it expire;
- nothing is copied back to Redis on recovery: local pins and verdicts were this
  replica's guesses during the outage, and Redis holds the cluster's.

``on_degraded`` and ``on_recovered`` hooks let the application re-seed local state
(revocations from the database) and re-sync caches whose invalidation events were lost
while Redis was away. Local answers wait for the ``on_degraded`` hooks (at most
``SEED_WAIT_SECONDS``): an empty local memory would tell a revoked token it was not
revoked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.lib.state.base import (
    MultiWindowDecision,
    ReserveWindow,
    StateStore,
    WindowDecision,
    WindowLimit,
    WindowTotal,
)
from app.lib.state.memory import MemoryStateStore

logger = structlog.get_logger()

Hook = Callable[[], Awaitable[None]]
T = TypeVar("T")

OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    TimeoutError,
)
"""What means "Redis is not there", as opposed to a bug (a script error, bad data)."""

DEFAULT_RETRY_SECONDS = 1.0
# Seeding is a few indexed reads; a request waits for it at most this long.
SEED_WAIT_SECONDS = 5.0


class StateStoreUnavailableError(RuntimeError):
    """The shared store is down and the operation must not fall back to local state."""


class FallbackStateStore:
    def __init__(
        self,
        shared: StateStore,
        *,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed_wait_seconds: float = SEED_WAIT_SECONDS,
    ) -> None:
        self.shared = shared
        self.local = MemoryStateStore()
        self.seed_wait_seconds = seed_wait_seconds
        # Set once the degraded hooks have seeded local memory for the current outage;
        # the task running them writes through without waiting for itself.
        self._seeded = asyncio.Event()
        self._seeding_task: asyncio.Task[None] | None = None
        self.retry_seconds = retry_seconds
        self._clock = clock
        self._down_since: float | None = None
        self._down = asyncio.Event()
        self._recovered = asyncio.Event()
        self._degraded_hooks: list[Hook] = []
        self._recovered_hooks: list[Hook] = []
        self._fallbacks = Counter(
            "arona_state_store_fallbacks_total",
            "State store calls served from this replica's memory while Redis was down",
            registry=registry,
        )
        self._degraded_gauge = Gauge(
            "arona_state_store_degraded",
            "1 while this replica serves shared state from its own memory (Redis down)",
            registry=registry,
        )

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    def on_degraded(self, hook: Hook) -> None:
        self._degraded_hooks.append(hook)

    def on_recovered(self, hook: Hook) -> None:
        self._recovered_hooks.append(hook)

    # -- the switch ---------------------------------------------------------------------

    def _went_down(self, operation: str, error: BaseException) -> None:
        if self._down_since is not None:
            return
        self._down_since = self._clock()
        self._degraded_gauge.set(1)
        self._recovered.clear()
        self._seeded.clear()
        self._down.set()
        logger.warning(
            "shared state store unreachable; serving from local memory",
            operation=operation,
            error=repr(error),
        )

    async def _call(
        self, operation: str, shared: Callable[[], Awaitable[T]], local: Callable[[], Awaitable[T]]
    ) -> T:
        if self._down_since is None:
            try:
                return await shared()
            except OUTAGE_ERRORS as exc:
                self._went_down(operation, exc)
        self._fallbacks.inc()
        if not self._seeded.is_set() and asyncio.current_task() is not self._seeding_task:
            await self._wait_seeded()
        return await local()

    async def _wait_seeded(self) -> None:
        try:
            async with asyncio.timeout(self.seed_wait_seconds):
                await self._seeded.wait()
        except TimeoutError:
            # The seed's source (the database) is slow or down too: serve what memory
            # holds rather than hold every request.
            logger.warning("local state served before it was seeded", waited=self.seed_wait_seconds)

    async def _strict(self, operation: str, shared: Callable[[], Awaitable[T]]) -> T:
        if self._down_since is not None:
            raise StateStoreUnavailableError(f"the shared state store is down ({operation})")
        try:
            return await shared()
        except OUTAGE_ERRORS as exc:
            self._went_down(operation, exc)
            raise StateStoreUnavailableError(
                f"the shared state store is down ({operation})"
            ) from exc

    async def watch(self) -> None:
        """While degraded, ping Redis every ``retry_seconds`` and switch back when it
        answers (run supervised for the life of the process)."""
        while True:
            await self._down.wait()
            self._seeding_task = asyncio.current_task()
            try:
                await self._run_hooks("degraded", self._degraded_hooks)
            finally:
                self._seeding_task = None
                self._seeded.set()
            await self._until_reachable()
            await self._recover()

    async def _until_reachable(self) -> None:
        while True:
            if await self.shared.ping():
                return
            await asyncio.sleep(self.retry_seconds)

    async def _recover(self) -> None:
        down_for = self._clock() - (self._down_since or self._clock())
        self._down_since = None
        self._down.clear()
        self._degraded_gauge.set(0)
        # What was kept locally was this replica's view of the outage; Redis has the
        # cluster's, and keeping both would resurface stale pins at the next outage.
        self.local = MemoryStateStore()
        logger.info("shared state store reachable again", down_seconds=round(down_for, 1))
        await self._run_hooks("recovered", self._recovered_hooks)
        self._recovered.set()

    async def wait_recovered(self) -> None:
        await self._recovered.wait()

    async def _run_hooks(self, phase: str, hooks: Sequence[Hook]) -> None:
        for hook in hooks:
            try:
                await hook()
            except Exception as exc:  # one failing re-sync must not stop the others
                logger.warning("state store hook failed", phase=phase, error=repr(exc))

    # -- StateStore -----------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return await self._call("get", lambda: self.shared.get(key), lambda: self.local.get(key))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._call(
            "set", lambda: self.shared.set(key, value, ttl), lambda: self.local.set(key, value, ttl)
        )

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return await self._call(
            "set_if_absent",
            lambda: self.shared.set_if_absent(key, value, ttl),
            lambda: self.local.set_if_absent(key, value, ttl),
        )

    async def delete(self, key: str) -> bool:
        return await self._call(
            "delete", lambda: self.shared.delete(key), lambda: self.local.delete(key)
        )

    async def exists(self, key: str) -> bool:
        return await self._call(
            "exists", lambda: self.shared.exists(key), lambda: self.local.exists(key)
        )

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        return await self._call(
            "incr",
            lambda: self.shared.incr(key, amount, ttl),
            lambda: self.local.incr(key, amount, ttl),
        )

    async def admit(self, key: str, amount: int, limit: int, window: float) -> WindowDecision:
        return await self._call(
            "admit",
            lambda: self.shared.admit(key, amount, limit, window),
            lambda: self.local.admit(key, amount, limit, window),
        )

    async def admit_windows(
        self, windows: Sequence[WindowLimit], amount: int = 1
    ) -> MultiWindowDecision:
        return await self._strict(
            "admit_windows", lambda: self.shared.admit_windows(windows, amount)
        )

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        return await self._strict(
            "reserve", lambda: self.shared.reserve(windows, hold_id, hold_ttl)
        )

    async def settle(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        return await self._strict("settle", lambda: self.shared.settle(hold_id, actuals))

    async def settle_many(self, settles: Sequence[tuple[str, Mapping[str, int]]]) -> list[bool]:
        return await self._strict("settle_many", lambda: self.shared.settle_many(settles))

    async def settle_part(self, hold_id: str, parts: Mapping[str, tuple[int, int]]) -> bool:
        return await self._strict("settle_part", lambda: self.shared.settle_part(hold_id, parts))

    async def release(self, hold_id: str) -> bool:
        return await self._strict("release", lambda: self.shared.release(hold_id))

    async def extend(self, hold_id: str, hold_ttl: float) -> bool:
        return await self._strict("extend", lambda: self.shared.extend(hold_id, hold_ttl))

    async def window_total(self, key: str) -> WindowTotal:
        return await self._strict("window_total", lambda: self.shared.window_total(key))

    async def push_sample(self, key: str, value: float, max_samples: int) -> None:
        await self._call(
            "push_sample",
            lambda: self.shared.push_sample(key, value, max_samples),
            lambda: self.local.push_sample(key, value, max_samples),
        )

    async def samples(self, key: str) -> list[float]:
        return await self._call(
            "samples", lambda: self.shared.samples(key), lambda: self.local.samples(key)
        )

    async def ping(self) -> bool:
        """Whether Redis answers (what readiness reports), not whether calls succeed."""
        return await self.shared.ping()

    async def close(self) -> None:
        await self.shared.close()
