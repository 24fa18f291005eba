"""Reservations on Redis (``RedisStateStore.reserve`` / ``settle`` / ``release`` /
``window_total``): one Lua script per operation, so no replica ever sees half of one.

Keys:

- the window counter ``W`` (the one ``admit_windows`` also uses): settled units plus
  live holds' units, ending with its window;
- one hold index per hash tag, ``holds:{<tag>}`` (``holds`` for ids without a tag):
  sorted set, hold id -> the hold's expiry (server milliseconds). All windows of a
  hold share its expiry, so one entry per hold replaces one per hold and window;
- the hold's record ``hold:<hold_id>``: hash, window key -> "<units>:<window end>",
  the end (server ms) the window had when the hold was taken.

A hold's units count in ``W`` only while ``W`` still ends when it did at reserve
time: a window that ends takes its holds with it, and a window restarted under the
same key (which ends at least its span later) is neither charged nor refunded for
them. The record lives as long as the longest of its windows (at least as long as
the hold), so the purge of an expired hold still finds its units; the index lives
at least as long as every record it names, and each reserve lengthens it only.

A reservation's keys share a Redis Cluster slot when the window keys and the hold id
carry one hash tag (``{<project>}``): the index and the record take the id's.

Time is the Redis server's (``TIME`` inside the scripts), not the replica's: a hold
taken on one replica is expired by another, and replicas' clocks drift; with one
clock, a replica running fast cannot release a live call's units early, nor a slow
one keep a dead replica's units. It is also the clock that ends the window keys
(``PEXPIRE``), so a hold and its window are judged alike. Scripts with ``TIME`` are
replicated by their effects (the default since Redis 5).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import cast

from redis.asyncio import Redis

from app.lib.state import redis_hold_scripts as scripts
from app.lib.state import redis_hold_settles as settles
from app.lib.state.base import (
    HoldInUseError,
    MultiWindowDecision,
    ReserveWindow,
    UnknownHoldWindowError,
    WindowCount,
    WindowTotal,
    check_actuals,
    check_hold_id,
    check_parts,
    check_reserve,
)
from app.lib.state.script_pipe import Script, StoreScripts

Clock = Callable[[], float]

_ATTEMPTS = 3
# Holds this process took and has not settled yet (their window keys), so that settle
# needs one round trip, not two; an entry is only a hint the script checks. Entries
# past their hold's end are dropped as new ones come, and the oldest beyond this many.
_KNOWN_MAX = 65_536


def _hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes (``{...}``), if it has one."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return None


def _ms(seconds: float, name: str) -> int:
    if seconds <= 0:
        raise ValueError(f"{name} must be positive, got {seconds}")
    return max(1, math.ceil(seconds * 1000))


class RedisHolds:
    """The reservation operations of one ``RedisStateStore`` (same client, prefix)."""

    def __init__(
        self, client: Redis, prefix: str, registry: StoreScripts, *, clock: Clock = time.monotonic
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._known: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._reserve = registry.register(scripts.RESERVE)
        self._settle = registry.register(settles.SETTLE)
        self._settle_many = registry.register(settles.SETTLE_MANY)
        self._settle_part = registry.register(settles.SETTLE_PART)
        self._extend = registry.register(settles.EXTEND)
        self._total = registry.register(scripts.TOTAL)

    def _hold_key(self, hold_id: str) -> str:
        return f"{self._prefix}hold:{hold_id}"

    def _index_key(self, key: str) -> str:
        """The hold index of ``key``'s hash tag (a hold id's, or a window key's)."""
        tag = _hash_tag(key)
        return f"{self._prefix}holds" if tag is None else f"{self._prefix}holds:{{{tag}}}"

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        check_reserve(windows, hold_id, hold_ttl)
        hold_ms = _ms(hold_ttl, "hold_ttl")
        keys = [self._hold_key(hold_id), self._index_key(hold_id)]
        specs: list[str] = []
        prefix = self._prefix
        ceil = math.ceil
        for key, limit, ttl, amount in windows:  # ttl > 0: check_reserve
            keys.append(prefix + key)
            specs.append(f"{-1 if limit is None else limit},{ceil(ttl * 1000)},{amount}")
        if not windows:
            # Nothing to hold; but a live id is still an error, as in memory.
            if await self._holds_live(keys[1], hold_id):
                raise HoldInUseError(f"hold {hold_id!r} is still live")
            return MultiWindowDecision(True, ())
        raw = await self._reserve(keys=keys, args=[hold_id, hold_ms, ";".join(specs)])
        if isinstance(raw, int):
            raise HoldInUseError(f"hold {hold_id!r} is still live")
        allowed, *parts = raw.decode().split(";")
        counts = []
        for window, part in zip(windows, parts, strict=True):
            fits, current, retry_ms = part.split(",")
            counts.append(
                WindowCount(
                    window.key, fits == "1", int(current), window.limit, int(retry_ms) / 1000
                )
            )
        if allowed != "1":
            return MultiWindowDecision(False, tuple(counts))
        self._remember(hold_id, hold_ttl, tuple(keys[2:]))
        return MultiWindowDecision(True, tuple(counts))

    async def _holds_live(self, index: str, hold_id: str) -> bool:
        expiry = await self._client.zscore(index, hold_id)
        if expiry is None:
            return False
        seconds, micros = await self._client.time()
        return expiry >= seconds * 1000 + micros // 1000

    def _remember(self, hold_id: str, hold_ttl: float, counters: tuple[str, ...]) -> None:
        now = self._clock()
        known = self._known
        while known:
            oldest = next(iter(known))
            if known[oldest][0] >= now and len(known) < _KNOWN_MAX:
                break
            del known[oldest]
        known[hold_id] = (now + hold_ttl, counters)

    def _forget(self, hold_id: str) -> tuple[str, ...] | None:
        """The windows this process reserved the hold in, if it did (dropping them)."""
        entry = self._known.pop(hold_id, None)
        return None if entry is None else entry[1]

    async def settle(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        check_hold_id(hold_id)
        check_actuals(actuals)
        plen = len(self._prefix)

        def args(counters: Sequence[str]) -> list[int | str]:
            # '' keeps the reserved amount of a window not named in ``actuals``.
            return [actuals.get(c[plen:], "") for c in counters]

        known = self._forget(hold_id)
        settled, _ = await self._on_hold(hold_id, set(actuals), known, self._settle, args)
        return settled

    async def settle_many(self, settles: Sequence[tuple[str, Mapping[str, int]]]) -> list[bool]:
        """Settle each (hold id, actuals) as ``settle`` would, those this process
        reserved in one script call per hash tag: the windows they share are named
        once, so a batch costs about one call's arguments per hold, not a call's."""
        for hold_id, actuals in settles:
            check_hold_id(hold_id)
            check_actuals(actuals)
        results: list[bool | None] = [None] * len(settles)
        groups: dict[str, list[int]] = {}
        for index, (hold_id, _) in enumerate(settles):
            if hold_id in self._known:
                groups.setdefault(self._index_key(hold_id), []).append(index)
        for hold_index, indexes in groups.items():
            await self._settle_group(hold_index, settles, indexes, results)
        for index, result in enumerate(results):
            if result is None:  # taken elsewhere, or its record changed: one by one
                results[index] = await self.settle(*settles[index])
        return [bool(r) for r in results]

    async def _settle_group(
        self,
        hold_index: str,
        settles: Sequence[tuple[str, Mapping[str, int]]],
        indexes: list[int],
        results: list[bool | None],
    ) -> None:
        plen = len(self._prefix)
        window_of: dict[str, int] = {}
        keys = [self._hold_key(settles[i][0]) for i in indexes]
        windows: list[str] = []
        specs: list[str] = []
        for i in indexes:
            hold_id, actuals = settles[i]
            counters = self._forget(hold_id) or ()
            parts = []
            for counter in counters:
                w = window_of.get(counter)
                if w is None:
                    w = window_of[counter] = len(window_of) + 1
                    windows.append(counter)
                actual = actuals.get(counter[plen:])
                parts.append(f"{w}={'' if actual is None else actual}")
            specs.append(f"{hold_id}\n{','.join(parts)}")
        outcomes = await self._settle_many(
            keys=[hold_index, *keys, *windows], args=[len(indexes), *specs]
        )
        for i, outcome in zip(indexes, outcomes, strict=True):
            if int(outcome) != -1:
                results[i] = int(outcome) == 1

    async def settle_part(self, hold_id: str, parts: Mapping[str, tuple[int, int]]) -> bool:
        check_hold_id(hold_id)
        check_parts(parts)
        plen = len(self._prefix)

        def args(counters: Sequence[str]) -> list[int | str]:
            spec = []
            for counter in counters:
                held, actual = parts.get(counter[plen:], (0, 0))
                spec.append(f"{held},{actual}")
            return [";".join(spec)]

        entry = self._known.get(hold_id)
        known = None if entry is None else entry[1]
        done, _ = await self._on_hold(hold_id, set(parts), known, self._settle_part, args)
        return done

    async def release(self, hold_id: str) -> bool:
        check_hold_id(hold_id)
        released, _ = await self._on_hold(
            hold_id, set(), self._forget(hold_id), self._settle, lambda cs: [0] * len(cs)
        )
        return released

    async def extend(self, hold_id: str, hold_ttl: float) -> bool:
        check_hold_id(hold_id)
        hold_ms = _ms(hold_ttl, "hold_ttl")
        extended, counters = await self._on_hold(
            hold_id, set(), self._forget(hold_id), self._extend, lambda _: [hold_ms]
        )
        if extended:
            self._remember(hold_id, hold_ttl, tuple(counters))
        return extended

    async def _on_hold(
        self,
        hold_id: str,
        names: AbstractSet[str],
        known: Sequence[str] | None,
        script: Script,
        args: Callable[[Sequence[str]], list[int | str]],
    ) -> tuple[bool, Sequence[str]]:
        """Run a hold script on the hold's windows: named from what this process
        reserved when it can (one round trip), else from the hold's record, since
        Redis Cluster wants every key a script touches declared. The script checks the
        record still names those windows (-1 when not: read it again)."""
        hold_key = self._hold_key(hold_id)
        index = self._index_key(hold_id)
        plen = len(self._prefix)
        counters = known
        for _ in range(_ATTEMPTS):
            if counters is None or names - {c[plen:] for c in counters}:
                # The store refuses decoding clients, so field names are bytes.
                record = cast("list[bytes]", await self._client.hkeys(hold_key))
                if not record:
                    return False, ()
                counters = [k.decode() for k in record]
                unknown = names - {c[plen:] for c in counters}
                if unknown:
                    # The record of an expired hold outlives it until purged; such a
                    # hold is gone, as in memory, whatever windows are named.
                    if not await self._holds_live(index, hold_id):
                        return False, ()
                    raise UnknownHoldWindowError(f"hold {hold_id!r} has no window {min(unknown)!r}")
            keys = [index, hold_key, *counters]
            outcome = int(await script(keys=keys, args=[hold_id, *args(counters)]))
            if outcome != -1:
                return outcome == 1, counters
            counters = None
        raise RuntimeError(f"hold {hold_id!r} kept changing under this call")

    async def window_total(self, key: str) -> WindowTotal:
        total, held, ttl_ms = await self._total(
            keys=[self._prefix + key, self._index_key(key)], args=[self._hold_key("")]
        )
        ttl = int(ttl_ms)
        return WindowTotal(key, int(total), int(held), None if ttl < 0 else ttl / 1000)
