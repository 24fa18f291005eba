"""Reservations on Redis (``RedisStateStore.reserve`` / ``settle`` / ``release`` /
``window_total``): one Lua script per operation, so no replica ever sees half of one.

Per window ``W`` (the counter ``admit_windows`` also uses, settled units plus live
holds) there are two more keys, ending with ``W``'s window:

- ``W|hold-expiry``: sorted set, hold id -> the hold's expiry (server milliseconds);
- ``W|hold-amount``: hash, hold id -> units that hold put in ``W``.

Each hold has a record ``hold:<hold_id>`` (hash: window key -> units), which lets
``settle`` find its windows by id. A reservation's keys share a Redis Cluster slot
when the window keys and the hold id carry one hash tag (``{<project>}``): every
derived key keeps its window's tag.

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
from app.lib.state.base import (
    HoldInUseError,
    MultiWindowDecision,
    ReserveWindow,
    UnknownHoldWindowError,
    WindowCount,
    WindowTotal,
    check_actuals,
    check_hold_id,
    check_reserve,
)
from app.lib.state.script_pipe import Script, StoreScripts

Clock = Callable[[], float]

_ATTEMPTS = 3
# Holds this process took and has not settled yet (their window keys), so that settle
# needs one round trip, not two; an entry is only a hint the script checks. Entries
# past their hold's end are dropped as new ones come, and the oldest beyond this many.
_KNOWN_MAX = 65_536


def _hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes (``{...}``), else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


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
        self._settle = registry.register(scripts.SETTLE)
        self._settle_many = registry.register(scripts.SETTLE_MANY)
        self._extend = registry.register(scripts.EXTEND)
        self._total = registry.register(scripts.TOTAL)

    def _hold_key(self, hold_id: str) -> str:
        return f"{self._prefix}hold:{hold_id}"

    @staticmethod
    def _window_keys(counter: str) -> list[str]:
        return [counter, counter + "|hold-expiry", counter + "|hold-amount"]

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        check_reserve(windows, hold_id, hold_ttl)
        hold_ms = _ms(hold_ttl, "hold_ttl")
        keys = [self._hold_key(hold_id)]
        specs: list[str] = []
        prefix = self._prefix
        ceil = math.ceil
        for key, limit, ttl, amount in windows:  # ttl > 0: check_reserve
            keys.append(prefix + key)
            specs.append(f"{-1 if limit is None else limit},{ceil(ttl * 1000)},{amount}")
        if not windows:
            # Nothing to hold; but a live id is still an error, as in memory.
            if await self._client.exists(keys[0]):
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
        self._remember(hold_id, hold_ttl, tuple(keys[1:]))
        return MultiWindowDecision(True, tuple(counts))

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
                groups.setdefault(_hash_tag(hold_id), []).append(index)
        for indexes in groups.values():
            await self._settle_group(settles, indexes, results)
        for index, result in enumerate(results):
            if result is None:  # taken elsewhere, or its record changed: one by one
                results[index] = await self.settle(*settles[index])
        return [bool(r) for r in results]

    async def _settle_group(
        self,
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
                    windows += self._window_keys(counter)
                actual = actuals.get(counter[plen:])
                parts.append(f"{w}={'' if actual is None else actual}")
            specs.append(f"{hold_id}\n{','.join(parts)}")
        outcomes = await self._settle_many(keys=[*keys, *windows], args=[len(indexes), *specs])
        for i, outcome in zip(indexes, outcomes, strict=True):
            if int(outcome) != -1:
                results[i] = int(outcome) == 1

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
                    raise UnknownHoldWindowError(f"hold {hold_id!r} has no window {min(unknown)!r}")
            keys = [hold_key]
            for counter in counters:
                keys += self._window_keys(counter)
            outcome = int(await script(keys=keys, args=[hold_id, *args(counters)]))
            if outcome != -1:
                return outcome == 1, counters
            counters = None
        raise RuntimeError(f"hold {hold_id!r} kept changing under this call")

    async def window_total(self, key: str) -> WindowTotal:
        total, held, ttl_ms = await self._total(keys=self._window_keys(self._prefix + key))
        ttl = int(ttl_ms)
        return WindowTotal(key, int(total), int(held), None if ttl < 0 else ttl / 1000)
