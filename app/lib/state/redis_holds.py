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
from typing import cast

from redis.asyncio import Redis

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

# Shared by the scripts: server time in ms, and the expired holds' purge. A purge
# unpacks ids in chunks (Lua's C stack takes ~8000 arguments) since a replica killed
# with thousands of calls in flight leaves that many to drop at once.
_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function sum_amounts(amounts, ids, drop)
  local sum = 0
  for s = 1, #ids, 1000 do
    local chunk = {unpack(ids, s, math.min(s + 999, #ids))}
    for _, a in ipairs(redis.call('HMGET', amounts, unpack(chunk))) do
      sum = sum + (tonumber(a) or 0)
    end
    if drop then
      redis.call('HDEL', amounts, unpack(chunk))
    end
  end
  return sum
end
-- A hold is live while now <= expiry, the rule Redis applies to key expiry.
local function purge(expiries, amounts, now)
  local ids = redis.call('ZRANGEBYSCORE', expiries, '-inf', '(' .. now)
  if #ids == 0 then
    return 0
  end
  redis.call('ZREMRANGEBYSCORE', expiries, '-inf', '(' .. now)
  return sum_amounts(amounts, ids, true)
end
"""

# KEYS: the hold record, then per window: counter, expiries, amounts.
# ARGV: hold_id, hold_ms, then per window: limit (-1 = none), window_ms, amount.
# Returns {-1} when the hold id is live, else {allowed, per window: fits, current, retry_ms}.
_RESERVE = (
    _COMMON
    + """
local now = now_ms()
local hold_id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {-1}
end
local n = (#KEYS - 1) / 3
local currents, ttls, fits = {}, {}, {}
local allowed = 1
for i = 1, n do
  local counter, expiries, amounts = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
  local limit = tonumber(ARGV[3 * i])
  local window_ms = tonumber(ARGV[3 * i + 1])
  local amount = tonumber(ARGV[3 * i + 2])
  local current = tonumber(redis.call('GET', counter) or '0')
  if current == nil then
    return redis.error_reply('window key ' .. counter .. ' does not hold an integer')
  end
  local ttl = redis.call('PTTL', counter)
  if ttl == -2 then
    -- holds of a window that ended must not be charged to the next one
    redis.call('DEL', expiries, amounts)
  else
    if ttl == -1 then
      redis.call('PEXPIRE', counter, window_ms)
      ttl = window_ms
    end
    local freed = purge(expiries, amounts, now)
    local stale = redis.call('HGET', amounts, hold_id)
    if stale then
      -- an earlier hold with this id whose record is gone: dead, though its expiry
      -- may be within the millisecond the two clocks' rounding leaves
      redis.call('ZREM', expiries, hold_id)
      redis.call('HDEL', amounts, hold_id)
      freed = freed + tonumber(stale)
    end
    if freed ~= 0 then
      current = redis.call('DECRBY', counter, freed)
    end
  end
  currents[i] = current
  ttls[i] = ttl
  if limit >= 0 and current + amount > limit then
    fits[i] = 0
    allowed = 0
  else
    fits[i] = 1
  end
end
local out = {allowed}
if allowed == 1 then
  local expires = now + tonumber(ARGV[2])
  for i = 1, n do
    local counter, expiries, amounts = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
    local amount = ARGV[3 * i + 2]
    local current = redis.call('INCRBY', counter, amount)
    local ttl = ttls[i]
    if ttl == -2 then
      ttl = tonumber(ARGV[3 * i + 1])
      redis.call('PEXPIRE', counter, ttl)
    end
    redis.call('ZADD', expiries, expires, hold_id)
    redis.call('HSET', amounts, hold_id, amount)
    redis.call('PEXPIRE', expiries, ttl)
    redis.call('PEXPIRE', amounts, ttl)
    redis.call('HSET', KEYS[1], counter, amount)
    out[#out + 1] = 1
    out[#out + 1] = current
    out[#out + 1] = 0
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return out
end
for i = 1, n do
  local retry = 0
  if fits[i] == 0 then
    retry = ttls[i]
    if retry == -2 then
      retry = tonumber(ARGV[3 * i + 1])
    elseif retry < 1 then
      retry = 1
    end
  end
  out[#out + 1] = fits[i]
  out[#out + 1] = currents[i]
  out[#out + 1] = retry
end
return out
"""
)

# KEYS: the hold record, then per window of the hold: counter, expiries, amounts.
# ARGV: hold_id, then per window: the actual units, or '' to keep the reserved ones.
# Returns 1 settled, 0 unknown or expired (nothing changed), -1 the record no longer
# names these windows (the id was reused since the caller read it: read again).
_SETTLE = (
    _COMMON
    + """
local now = now_ms()
local hold_id = ARGV[1]
local n = (#KEYS - 1) / 3
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('HLEN', KEYS[1]) ~= n then
  return -1
end
local present = {}
local any = false
for i = 1, n do
  if redis.call('HEXISTS', KEYS[1], KEYS[3 * i - 1]) == 0 then
    return -1
  end
  local expiry = redis.call('ZSCORE', KEYS[3 * i], hold_id)
  if expiry then
    if tonumber(expiry) < now then
      -- expired: the next reserve on the window purges it; nothing to settle
      return 0
    end
    present[i] = true
    any = true
  end
end
redis.call('DEL', KEYS[1])
if not any then
  -- every window of the hold ended: there is nothing left to settle
  return 0
end
for i = 1, n do
  if present[i] then
    local counter, expiries, amounts = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
    local reserved = tonumber(redis.call('HGET', amounts, hold_id) or '0')
    if ARGV[i + 1] ~= '' and redis.call('EXISTS', counter) == 1 then
      local delta = tonumber(ARGV[i + 1]) - reserved
      if delta ~= 0 then
        redis.call('INCRBY', counter, delta)
      end
    end
    redis.call('ZREM', expiries, hold_id)
    redis.call('HDEL', amounts, hold_id)
  end
end
return 1
"""
)

# KEYS: counter, expiries, amounts. Returns {total, held, ttl_ms} (ttl -2: no window).
_TOTAL = (
    _COMMON
    + """
local now = now_ms()
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current == nil then
  return redis.error_reply('window key ' .. KEYS[1] .. ' does not hold an integer')
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  return {0, 0, -2}
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
local live = redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf')
local held = sum_amounts(KEYS[3], live, false)
return {current - sum_amounts(KEYS[3], expired, false), held, ttl}
"""
)

Clock = Callable[[], float]

_SETTLE_ATTEMPTS = 3
# Holds this process took and has not settled yet (their window keys), so that settle
# needs one round trip, not two; an entry is only a hint the script checks. Entries
# past their hold's end are dropped as new ones come, and the oldest beyond this many.
_KNOWN_MAX = 65_536


def _ms(seconds: float, name: str) -> int:
    if seconds <= 0:
        raise ValueError(f"{name} must be positive, got {seconds}")
    return max(1, math.ceil(seconds * 1000))


class RedisHolds:
    """The reservation operations of one ``RedisStateStore`` (same client, prefix)."""

    def __init__(self, client: Redis, prefix: str, *, clock: Clock = time.monotonic) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._known: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._total = client.register_script(_TOTAL)

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
        args: list[int | str] = [hold_id, hold_ms]
        for window in windows:
            keys += self._window_keys(self._prefix + window.key)
            limit = -1 if window.limit is None else window.limit
            args += [limit, _ms(window.ttl, "ttl"), window.amount]
        if not windows:
            # Nothing to hold; but a live id is still an error, as in memory.
            if await self._client.exists(keys[0]):
                raise HoldInUseError(f"hold {hold_id!r} is still live")
            return MultiWindowDecision(True, ())
        reply = await self._reserve(keys=keys, args=args)
        if int(reply[0]) == -1:
            raise HoldInUseError(f"hold {hold_id!r} is still live")
        counts = tuple(
            WindowCount(
                window.key,
                bool(reply[1 + 3 * i]),
                int(reply[2 + 3 * i]),
                window.limit,
                int(reply[3 + 3 * i]) / 1000,
            )
            for i, window in enumerate(windows)
        )
        if reply[0]:
            self._remember(hold_id, hold_ttl, tuple(self._prefix + w.key for w in windows))
        return MultiWindowDecision(bool(reply[0]), counts)

    def _remember(self, hold_id: str, hold_ttl: float, counters: tuple[str, ...]) -> None:
        now = self._clock()
        known = self._known
        while known:
            oldest = next(iter(known))
            if known[oldest][0] >= now and len(known) < _KNOWN_MAX:
                break
            del known[oldest]
        known[hold_id] = (now + hold_ttl, counters)

    async def settle(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        check_hold_id(hold_id)
        check_actuals(actuals)
        return await self._finish(hold_id, actuals, release=False)

    async def release(self, hold_id: str) -> bool:
        check_hold_id(hold_id)
        return await self._finish(hold_id, {}, release=True)

    async def _finish(self, hold_id: str, actuals: Mapping[str, int], *, release: bool) -> bool:
        hold_key = self._hold_key(hold_id)
        plen = len(self._prefix)
        known = self._known.pop(hold_id, None)
        for _ in range(_SETTLE_ATTEMPTS):
            # The record names the windows; the script is then given every key it
            # touches, as Redis Cluster requires, and checks the record still matches.
            # A hold taken here names them without asking (the usual case).
            if known is not None and not set(actuals) - {c[plen:] for c in known[1]}:
                counters: Sequence[str] = known[1]
            else:
                # The store refuses decoding clients, so field names are bytes.
                record = cast("list[bytes]", await self._client.hkeys(hold_key))
                if not record:
                    return False
                counters = [k.decode() for k in record]
                unknown = set(actuals) - {c[plen:] for c in counters}
                if unknown:
                    raise UnknownHoldWindowError(f"hold {hold_id!r} has no window {min(unknown)!r}")
            known = None
            keys = [hold_key]
            args: list[int | str] = [hold_id]
            for counter in counters:
                keys += self._window_keys(counter)
                actual = 0 if release else actuals.get(counter[plen:])
                args.append("" if actual is None else actual)
            outcome = int(await self._settle(keys=keys, args=args))
            if outcome != -1:
                return outcome == 1
        raise RuntimeError(f"hold {hold_id!r} kept changing while it was settled")

    async def window_total(self, key: str) -> WindowTotal:
        total, held, ttl_ms = await self._total(keys=self._window_keys(self._prefix + key))
        ttl = int(ttl_ms)
        return WindowTotal(key, int(total), int(held), None if ttl < 0 else ttl / 1000)
