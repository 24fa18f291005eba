"""Single-process ``StateStore``: a dict guarded only by the event loop.

Every method does its work without awaiting, so each operation is atomic with
respect to other coroutines; no lock is needed. Semantics mirror the Redis store
(``set`` clears a previous TTL, ``incr`` keeps it, ``ttl`` must be positive) so that
code tested against the embedded default behaves the same in a cluster.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.lib.state.base import (
    MultiWindowDecision,
    WindowCount,
    WindowDecision,
    WindowLimit,
    check_max_samples,
    check_windows,
)

Clock = Callable[[], float]


@dataclass(slots=True)
class _Entry:
    value: bytes | deque[float]
    expires_at: float | None


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
        self._next_purge = clock() + purge_interval

    def __len__(self) -> int:
        """Stored entries, including expired ones not yet swept."""
        return len(self._entries)

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
            counts = []
            for (window, entry, current), room in zip(seen, fits, strict=True):
                retry = 0.0
                if not room:
                    ends = now + window.ttl if entry is None else entry.expires_at
                    retry = (now + window.ttl if ends is None else ends) - now
                counts.append(WindowCount(window.key, room, current, window.limit, retry))
            return MultiWindowDecision(False, tuple(counts))
        admitted = []
        for window, entry, current in seen:
            new = current + amount
            if entry is None:
                self._entries[window.key] = _Entry(b"%d" % new, now + window.ttl)
            else:
                entry.value = b"%d" % new
            admitted.append(WindowCount(window.key, True, new, window.limit, 0.0))
        return MultiWindowDecision(True, tuple(admitted))

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
