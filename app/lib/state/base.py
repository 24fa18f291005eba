"""The ``StateStore`` interface: hot, shared, short-lived state.

Pins, breaker/cooldown state, quota counters, rate windows, latency samples and
revocation marks live here. The in-memory implementation serves a single process;
the Redis implementation makes every replica see the same state, with each
operation atomic (single command or Lua script) so that concurrent replicas
never over-admit.

Keys are plain strings; implementations add their own namespace prefix.
Values are bytes (callers encode with msgspec).

Reservations (``reserve`` / ``settle`` / ``release``) hold units in windows for the
length of a call: counted against the limit while the call runs, then replaced by
what the call actually used. A hold that is never settled (its replica was killed)
expires after its own TTL and stops counting, with no background task: whoever
touches the window next discounts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class WindowDecision:
    """Outcome of a fixed-window admission (rate limit or quota)."""

    allowed: bool
    current: int
    """Units counted in the window after this call (unchanged when refused)."""
    limit: int
    retry_after: float
    """Seconds until the window resets (0 when allowed)."""


# The windows and counts of an admission are named tuples rather than frozen
# dataclasses: a call with budgets and key limits builds two dozen of them, and a
# frozen dataclass costs four times as much to construct.
class WindowLimit(NamedTuple):
    """One window of a multi-window admission (``StateStore.admit_windows``)."""

    key: str
    limit: int | None
    """Most units the window may hold; ``None`` counts without a limit."""
    ttl: float
    """Seconds the window lasts, counted from the admission that creates its key."""


class WindowCount(NamedTuple):
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
    _check_window_shapes(windows)


def _check_window_shapes(windows: Sequence[WindowLimit | ReserveWindow]) -> None:
    """Positive TTLs, limits of None or at least 0, and no key given twice."""
    keys = set()
    for window in windows:
        if window.ttl <= 0:
            raise ValueError(f"ttl must be positive, got {window.ttl}")
        if window.limit is not None and window.limit < 0:
            raise ValueError(f"limit must be None or at least 0, got {window.limit}")
        if window.key in keys:
            raise ValueError(f"window key {window.key!r} given twice")
        keys.add(window.key)


class ReserveWindow(NamedTuple):
    """One window of a reservation (``StateStore.reserve``), with its own amount."""

    key: str
    limit: int | None
    """Most units the window may hold; ``None`` counts without a limit."""
    ttl: float
    """Seconds the window lasts, counted from the call that creates its key."""
    amount: int
    """Units to hold (1 request, N estimated tokens, M micro-units); 0 only counts."""


@dataclass(frozen=True, slots=True)
class WindowTotal:
    """What a window holds now (``StateStore.window_total``), expired holds discounted."""

    key: str
    total: int
    """Settled units plus the amounts of live holds (0 when the window is closed)."""
    held: int
    """The part of ``total`` still reserved by live holds (calls in flight)."""
    resets_in: float | None
    """Seconds until the window ends; ``None`` when no window is open."""


def check_reserve(windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float) -> None:
    """The argument checks both implementations make before ``reserve``."""
    check_hold_id(hold_id)
    check_hold_ttl(hold_ttl)
    for window in windows:
        if window.amount < 0:
            raise ValueError(f"amount must be at least 0, got {window.amount}")
    _check_window_shapes(windows)


def check_hold_ttl(hold_ttl: float) -> None:
    if hold_ttl <= 0:
        raise ValueError(f"hold_ttl must be positive, got {hold_ttl}")


def check_hold_id(hold_id: str) -> None:
    if not hold_id:
        raise ValueError("hold_id must not be empty")


def check_actuals(actuals: Mapping[str, int]) -> None:
    """The argument check both implementations make before ``settle``."""
    for key, amount in actuals.items():
        if amount < 0:
            raise ValueError(f"actual amount for {key!r} must be at least 0, got {amount}")


def check_parts(parts: Mapping[str, tuple[int, int]]) -> None:
    """The argument check both implementations make before ``settle_part``."""
    for key, (held, actual) in parts.items():
        if held < 0 or actual < 0:
            raise ValueError(f"part amounts for {key!r} must be at least 0, got {held}, {actual}")


class HoldInUseError(ValueError):
    """``reserve`` was given the id of a hold that is still live."""


class UnknownHoldWindowError(ValueError):
    """``settle`` named a window the hold did not reserve in."""


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

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        """Atomically add each window's ``amount`` to it, or change nothing.

        The windows' rule is ``admit_windows``'s (same counters, so the two see each
        other's units): every limited window needs ``current + amount <= limit``. When
        allowed, the amounts are recorded as the hold ``hold_id``, live for
        ``hold_ttl`` seconds: ``settle`` turns them into actuals, ``release`` gives
        them back, and a hold neither settled nor released in time (its replica died)
        stops counting: the next ``reserve`` on a window purges the window's expired
        holds, and ``window_total`` discounts them. Expiry is judged by the store's one
        clock (the Redis server's), never a replica's. ``current`` in the decision
        includes every live hold. Raises ``HoldInUseError`` when ``hold_id`` is live,
        ``ValueError`` for negative amounts or limits, non-positive TTLs, repeated keys
        or an empty ``hold_id``. No windows: allowed, nothing recorded.

        In a Redis Cluster a window's keys and the hold's key must share a slot: give
        the window keys and ``hold_id`` one hash tag (``quota:{<project>}:...``).
        """
        ...

    async def settle(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        """Replace the hold's amount in each window named in ``actuals`` by the actual
        one (lower: the rest is given back; higher: the overage is counted, even past
        the limit, since the call happened), keep the reserved amount in the others,
        and drop the hold, in one atomic step. A window whose key ended meanwhile is
        left alone (its successor never held this hold).

        False, changing nothing, when the hold is unknown (already settled or
        released, expired, never made) or every window it held in has ended. Raises
        ``UnknownHoldWindowError`` (a ``ValueError``), changing nothing, when
        ``actuals`` names a window the live hold does not have, and ``ValueError`` for
        a negative actual.
        """
        ...

    async def settle_many(self, settles: Sequence[tuple[str, Mapping[str, int]]]) -> list[bool]:
        """``settle`` each (hold id, actuals), in as few round trips as the store can
        (the calls that ended together); the results in order. Argument errors raise
        before anything is settled."""
        ...

    async def settle_part(self, hold_id: str, parts: Mapping[str, tuple[int, int]]) -> bool:
        """End a part of a live hold, keeping the hold for the rest (a lease's calls
        end one by one): per window named in ``parts`` as ``(held, actual)``, ``held``
        units leave the hold (at most what it still holds there) and the window counts
        ``actual`` in their place, in one atomic step. Windows not named are left
        alone; a window whose key ended meanwhile too (as in ``settle``).

        False, changing nothing, when the hold is unknown (settled, released,
        expired, never made) or every window it held in has ended: the caller counts
        the actual units itself. Raises ``UnknownHoldWindowError`` for a window the
        live hold does not have and ``ValueError`` for a negative amount.
        """
        ...

    async def release(self, hold_id: str) -> bool:
        """Give back everything the hold reserved (the call never reached the
        upstream) and drop it; False, changing nothing, when the hold is unknown."""
        ...

    async def extend(self, hold_id: str, hold_ttl: float) -> bool:
        """Make a live hold end ``hold_ttl`` seconds from now (a long call's heartbeat,
        so that ``hold_ttl`` can stay short and a dead replica's units come back soon).
        False, changing nothing, when the hold is unknown, expired, or every window it
        held in has ended. ``ValueError`` for a non-positive ``hold_ttl``."""
        ...

    async def window_total(self, key: str) -> WindowTotal:
        """The window's count now, live holds included and expired ones discounted
        (what a console shows; the same number ``reserve`` would compare)."""
        ...

    async def push_sample(self, key: str, value: float, max_samples: int) -> None:
        """Append to a bounded list of recent samples (latency tracking)."""
        ...

    async def samples(self, key: str) -> list[float]: ...

    async def ping(self) -> bool:
        """True when the store is reachable."""
        ...

    async def close(self) -> None: ...
