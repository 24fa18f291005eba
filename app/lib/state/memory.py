"""Single-process ``StateStore``: a dict guarded only by the event loop.

Every method does its work without awaiting, so each operation is atomic with
respect to other coroutines; no lock is needed. Semantics mirror the Redis store
(``set`` clears a previous TTL, ``incr`` keeps it, ``ttl`` must be positive) so that
code tested against the embedded default behaves the same in a cluster.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.lib.state.base import (
    HoldInUseError,
    MultiWindowDecision,
    ReserveWindow,
    UnknownHoldWindowError,
    WindowCount,
    WindowDecision,
    WindowLimit,
    WindowTotal,
    check_actuals,
    check_hold_id,
    check_hold_ttl,
    check_max_samples,
    check_parts,
    check_reserve,
    check_windows,
)
from app.lib.state.memory_holds import Hold, WindowHolds

Clock = Callable[[], float]


@dataclass(slots=True)
class _Entry:
    value: bytes | deque[float]
    expires_at: float | None
    holds: WindowHolds | None = None
    """Reservations counted in this window; they end with it (a new window starts
    without them, as on Redis)."""


def _check_ttl(ttl: float | None) -> None:
    # Redis rejects non-positive expiries; refusing here too keeps both stores alike.
    if ttl is not None and ttl <= 0:
        raise ValueError(f"ttl must be positive, got {ttl}")


class MemoryStateStore:
    """In-process state; expired keys vanish lazily on access and in periodic sweeps.

    ``clock`` must be monotonic (seconds); tests inject a fake one. Sweeps run on
    writes at most every ``purge_interval`` seconds so keys that are written once and
    never read again (e.g. per-minute rate windows) cannot accumulate forever.
    """

    def __init__(self, *, clock: Clock = time.monotonic, purge_interval: float = 30.0) -> None:
        self._clock = clock
        self._purge_interval = purge_interval
        self._entries: dict[str, _Entry] = {}
        self._holds: dict[str, Hold] = {}
        self._next_purge = clock() + purge_interval

    def __len__(self) -> int:
        """Stored entries, including expired ones not yet swept."""
        return len(self._entries)

    def hold_records(self) -> int:
        """Hold records kept, including expired ones not yet swept."""
        return len(self._holds)

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at is not None and entry.expires_at <= now:
            del self._entries[key]
            return None
        return entry

    def _write_clock(self) -> float:
        now = self._clock()
        if now >= self._next_purge:
            self._entries = {
                k: e for k, e in self._entries.items() if e.expires_at is None or e.expires_at > now
            }
            self._holds = {k: h for k, h in self._holds.items() if h.live(now)}
            self._next_purge = now + self._purge_interval
        return now

    def _bytes(self, key: str, entry: _Entry | None) -> bytes | None:
        if entry is None:
            return None
        if not isinstance(entry.value, bytes):
            raise TypeError(f"key {key!r} holds samples, not a value")
        return entry.value

    async def get(self, key: str) -> bytes | None:
        return self._bytes(key, self._live(key, self._clock()))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        _check_ttl(ttl)
        now = self._write_clock()
        self._entries[key] = _Entry(bytes(value), None if ttl is None else now + ttl)

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        _check_ttl(ttl)
        now = self._write_clock()
        if self._live(key, now) is not None:
            return False
        self._entries[key] = _Entry(bytes(value), None if ttl is None else now + ttl)
        return True

    async def delete(self, key: str) -> bool:
        if self._live(key, self._clock()) is None:
            return False
        del self._entries[key]
        return True

    async def exists(self, key: str) -> bool:
        return self._live(key, self._clock()) is not None

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        _check_ttl(ttl)
        now = self._write_clock()
        entry = self._live(key, now)
        current = self._bytes(key, entry)
        if entry is None or current is None:
            self._entries[key] = _Entry(b"%d" % amount, None if ttl is None else now + ttl)
            return amount
        new = int(current) + amount
        entry.value = b"%d" % new
        return new

    async def admit(self, key: str, amount: int, limit: int, window: float) -> WindowDecision:
        _check_ttl(window)
        now = self._write_clock()
        entry = self._live(key, now)
        raw = self._bytes(key, entry)
        current = 0 if raw is None else int(raw)
        if entry is not None and entry.expires_at is None:
            # A window without expiry (written via ``set``) would lock callers out
            # forever; start the window now instead, as the Redis script does.
            entry.expires_at = now + window
        if current + amount > limit:
            # With no window open the request can never fit; a full window is the
            # most honest hint we can give.
            ends = now + window if entry is None or entry.expires_at is None else entry.expires_at
            return WindowDecision(False, current, limit, ends - now)
        current += amount
        if entry is None:
            self._entries[key] = _Entry(b"%d" % current, now + window)
        else:
            entry.value = b"%d" % current
        return WindowDecision(True, current, limit, 0.0)

    async def admit_windows(
        self, windows: Sequence[WindowLimit], amount: int = 1
    ) -> MultiWindowDecision:
        check_windows(windows, amount)
        if not windows:
            return MultiWindowDecision(True, ())
        now = self._write_clock()
        # First pass reads (and repairs windows without expiry, as ``admit`` does);
        # the second writes only if every window has room. No await in between.
        seen: list[tuple[WindowLimit, _Entry | None, int]] = []
        for window in windows:
            entry = self._live(window.key, now)
            raw = self._bytes(window.key, entry)
            current = 0 if raw is None else int(raw)
            if entry is not None and entry.expires_at is None:
                entry.expires_at = now + window.ttl
            seen.append((window, entry, current))
        fits = [w.limit is None or current + amount <= w.limit for w, _, current in seen]
        if not all(fits):
            return _refusal(seen, fits, now)
        admitted = []
        for window, entry, current in seen:
            new = current + amount
            if entry is None:
                self._entries[window.key] = _Entry(b"%d" % new, now + window.ttl)
            else:
                entry.value = b"%d" % new
            admitted.append(WindowCount(window.key, True, new, window.limit, 0.0))
        return MultiWindowDecision(True, tuple(admitted))

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        check_reserve(windows, hold_id, hold_ttl)
        now = self._write_clock()
        if self._live_hold(hold_id, now) is not None:
            raise HoldInUseError(f"hold {hold_id!r} is still live")
        if not windows:
            return MultiWindowDecision(True, ())
        seen: list[tuple[ReserveWindow, _Entry | None, int]] = []
        for window in windows:
            entry = self._live(window.key, now)
            raw = self._bytes(window.key, entry)
            current = 0 if raw is None else int(raw)
            if entry is not None:
                if entry.expires_at is None:
                    entry.expires_at = now + window.ttl
                if entry.holds is not None and (freed := entry.holds.purge(now)):
                    current -= freed
                    entry.value = b"%d" % current
            seen.append((window, entry, current))
        fits = [w.limit is None or current + w.amount <= w.limit for w, _, current in seen]
        if not all(fits):
            return _refusal(seen, fits, now)
        expires_at = now + hold_ttl
        admitted = []
        for window, entry, current in seen:
            new = current + window.amount
            if entry is None:
                entry = self._entries[window.key] = _Entry(b"%d" % new, now + window.ttl)
            else:
                entry.value = b"%d" % new
            if entry.holds is None:
                entry.holds = WindowHolds()
            entry.holds.add(hold_id, window.amount, expires_at)
            admitted.append(WindowCount(window.key, True, new, window.limit, 0.0))
        self._holds[hold_id] = Hold(expires_at, {w.key: w.amount for w in windows})
        return MultiWindowDecision(True, tuple(admitted))

    def _live_hold(self, hold_id: str, now: float) -> Hold | None:
        hold = self._holds.get(hold_id)
        if hold is not None and not hold.live(now):
            # Its units leave the windows when they are next purged or read.
            del self._holds[hold_id]
            return None
        return hold

    async def settle(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        check_hold_id(hold_id)
        check_actuals(actuals)
        return self._finish(hold_id, actuals)

    async def settle_many(self, settles: Sequence[tuple[str, Mapping[str, int]]]) -> list[bool]:
        for hold_id, actuals in settles:
            check_hold_id(hold_id)
            check_actuals(actuals)
        return [self._finish(hold_id, actuals) for hold_id, actuals in settles]

    async def settle_part(self, hold_id: str, parts: Mapping[str, tuple[int, int]]) -> bool:
        check_hold_id(hold_id)
        check_parts(parts)
        now = self._write_clock()
        hold = self._hold_naming(hold_id, parts, now)
        if hold is None:
            return False
        counted = False
        for key, (held, actual) in parts.items():
            entry = self._live(key, now)
            holds = None if entry is None else entry.holds
            taken = None if holds is None else holds.reduce(hold_id, held)
            if entry is None or taken is None:
                continue  # the window ended: its successor never held this hold
            counted = True
            hold.amounts[key] -= taken
            self._add(key, entry, actual - taken)
        return counted

    async def release(self, hold_id: str) -> bool:
        check_hold_id(hold_id)
        hold = self._live_hold(hold_id, self._clock())
        return hold is not None and self._finish(hold_id, dict.fromkeys(hold.amounts, 0))

    def _finish(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        now = self._write_clock()
        hold = self._hold_naming(hold_id, actuals, now)
        if hold is None:
            return False
        del self._holds[hold_id]
        settled = False
        for key in hold.amounts:
            entry = self._live(key, now)
            # A window that ended (and maybe restarted) since the reservation no longer
            # holds these units; the call is not charged to its successor.
            reserved = None if entry is None or entry.holds is None else entry.holds.take(hold_id)
            if entry is None or reserved is None:
                continue
            settled = True
            self._add(key, entry, actuals.get(key, reserved) - reserved)
        # As on Redis: a hold all of whose windows ended had nothing left to settle.
        return settled

    def _hold_naming(self, hold_id: str, keys: Iterable[str], now: float) -> Hold | None:
        """The live hold, None when there is none; ``UnknownHoldWindowError`` when
        ``keys`` names a window it does not hold in."""
        hold = self._live_hold(hold_id, now)
        if hold is None:
            return None
        unknown = [key for key in keys if key not in hold.amounts]
        if unknown:
            raise UnknownHoldWindowError(f"hold {hold_id!r} has no window {unknown[0]!r}")
        return hold

    def _add(self, key: str, entry: _Entry, delta: int) -> None:
        if delta:
            entry.value = b"%d" % (int(self._bytes(key, entry) or b"0") + delta)

    async def extend(self, hold_id: str, hold_ttl: float) -> bool:
        check_hold_id(hold_id)
        check_hold_ttl(hold_ttl)
        now = self._write_clock()
        hold = self._live_hold(hold_id, now)
        if hold is None:
            return False
        expires_at = now + hold_ttl
        extended = False
        for key in hold.amounts:
            entry = self._live(key, now)
            if entry is not None and entry.holds is not None:
                extended = entry.holds.extend(hold_id, expires_at) or extended
        if extended:
            self._holds[hold_id] = Hold(expires_at, hold.amounts)
        return extended

    async def window_total(self, key: str) -> WindowTotal:
        now = self._clock()
        entry = self._live(key, now)
        raw = self._bytes(key, entry)
        if entry is None or raw is None:
            return WindowTotal(key, 0, 0, None)
        total, held = int(raw), 0
        if entry.holds is not None:
            # Discounted, not purged: a read writes nothing, as on Redis.
            expired, held = entry.holds.split(now)
            total -= expired
        resets_in = None if entry.expires_at is None else entry.expires_at - now
        return WindowTotal(key, total, held, resets_in)

    async def push_sample(self, key: str, value: float, max_samples: int) -> None:
        check_max_samples(max_samples)
        now = self._write_clock()
        entry = self._live(key, now)
        if entry is None:
            self._entries[key] = _Entry(deque([float(value)], maxlen=max_samples), None)
            return
        if isinstance(entry.value, bytes):
            raise TypeError(f"key {key!r} holds a value, not samples")
        samples = entry.value
        if samples.maxlen != max_samples:
            # The bound belongs to the caller, not the key; honour the latest one.
            samples = entry.value = deque(samples, maxlen=max_samples)
        samples.append(float(value))

    async def samples(self, key: str) -> list[float]:
        entry = self._live(key, self._clock())
        if entry is None:
            return []
        if isinstance(entry.value, bytes):
            raise TypeError(f"key {key!r} holds a value, not samples")
        return list(entry.value)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._entries.clear()
        self._holds.clear()


def _refusal(
    seen: Sequence[tuple[WindowLimit | ReserveWindow, _Entry | None, int]],
    fits: Sequence[bool],
    now: float,
) -> MultiWindowDecision:
    counts = []
    for (window, entry, current), room in zip(seen, fits, strict=True):
        retry = 0.0
        if not room:
            ends = now + window.ttl if entry is None else entry.expires_at
            retry = (now + window.ttl if ends is None else ends) - now
        counts.append(WindowCount(window.key, room, current, window.limit, retry))
    return MultiWindowDecision(False, tuple(counts))
