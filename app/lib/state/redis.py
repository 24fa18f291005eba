"""Cluster ``StateStore`` on Redis: every operation is one command or one Lua script.

Multi-step operations (``incr`` with a creation TTL, ``admit``, ``admit_windows``, and
the reservations in ``redis_holds``) run as Lua because a read-then-write from Python
would let two replicas both see room in a window and both admit. Scripts are sent with
EVALSHA (redis-py reloads them after a restart). ``settle`` and ``release`` name every
key their script touches (Redis Cluster wants them declared) from what this process
reserved, or else read the hold's record first; the script checks the record matches.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any, Self, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.lib.state.base import (
    MultiWindowDecision,
    ReserveWindow,
    WindowCount,
    WindowDecision,
    WindowLimit,
    WindowTotal,
    check_max_samples,
    check_windows,
)
from app.lib.state.redis_holds import RedisHolds
from app.lib.state.script_pipe import StoreScripts

# KEYS[1]=counter; ARGV: amount, ttl_ms ("" for none). TTL only when this call creates the key.
_INCR = """
local existed = redis.call('EXISTS', KEYS[1])
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
if existed == 0 and ARGV[2] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return value
"""

# KEYS[1]=window; ARGV: amount, limit, window_ms. Returns {allowed, current, retry_after_ms}.
_ADMIT = """
local amount = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local window_ms = tonumber(ARGV[3])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current == nil then
  return redis.error_reply('window key ' .. KEYS[1] .. ' does not hold an integer')
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then
  -- a window without expiry (written by SET) would lock callers out forever
  redis.call('PEXPIRE', KEYS[1], window_ms)
  ttl = window_ms
end
if current + amount > limit then
  if ttl == -2 then
    ttl = window_ms
  elseif ttl < 1 then
    ttl = 1
  end
  return {0, current, ttl}
end
current = redis.call('INCRBY', KEYS[1], amount)
if ttl == -2 then
  redis.call('PEXPIRE', KEYS[1], window_ms)
end
return {1, current, 0}
"""

# KEYS = the windows; ARGV: amount, then per window: limit (-1 = none), window_ms.
# Reads every window first (repairing keys without expiry, as _ADMIT does) and writes
# only when all have room. Returns {allowed, then per window: fits, current, retry_ms}.
# In a Redis Cluster the keys must share a hash slot (callers use a {hash tag}).
_ADMIT_WINDOWS = """
local amount = tonumber(ARGV[1])
local n = #KEYS
local currents, ttls, fits = {}, {}, {}
local allowed = 1
for i = 1, n do
  local limit = tonumber(ARGV[2 * i])
  local window_ms = tonumber(ARGV[2 * i + 1])
  local current = tonumber(redis.call('GET', KEYS[i]) or '0')
  if current == nil then
    return redis.error_reply('window key ' .. KEYS[i] .. ' does not hold an integer')
  end
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl == -1 then
    redis.call('PEXPIRE', KEYS[i], window_ms)
    ttl = window_ms
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
for i = 1, n do
  local window_ms = tonumber(ARGV[2 * i + 1])
  if allowed == 1 then
    local current = redis.call('INCRBY', KEYS[i], amount)
    if ttls[i] == -2 then
      redis.call('PEXPIRE', KEYS[i], window_ms)
    end
    out[#out + 1] = 1
    out[#out + 1] = current
    out[#out + 1] = 0
  else
    local retry = 0
    if fits[i] == 0 then
      retry = ttls[i]
      if retry == -2 then
        retry = window_ms
      elseif retry < 1 then
        retry = 1
      end
    end
    out[#out + 1] = fits[i]
    out[#out + 1] = currents[i]
    out[#out + 1] = retry
  end
end
return out
"""

_PING_TIMEOUT = 2.0


def _ms(seconds: float, name: str) -> int:
    if seconds <= 0:
        raise ValueError(f"{name} must be positive, got {seconds}")
    # Round up so a sub-millisecond TTL never becomes 0 (which Redis rejects).
    return max(1, math.ceil(seconds * 1000))


class RedisStateStore:
    """State shared by every replica through one Redis.

    ``client`` must return bytes (``decode_responses=False``). The store closes the
    client in :meth:`close` only when it created it (:meth:`from_url`), so a client
    shared with other components is left to its owner.
    """

    def __init__(
        self,
        client: Redis,
        prefix: str = "arona:",
        *,
        owns_client: bool = False,
        scripts: StoreScripts | None = None,
    ) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("RedisStateStore needs a client with decode_responses=False")
        self._client = client
        self._prefix = prefix
        self._owns_client = owns_client
        # Shared ``scripts`` (the app's, also carrying the usage stream's appends) are
        # their owner's to close; the store closes only those it made.
        self._owns_scripts = scripts is None
        self._scripts = StoreScripts(client) if scripts is None else scripts
        self._incr = self._scripts.register(_INCR)
        self._admit = self._scripts.register(_ADMIT)
        self._admit_windows = self._scripts.register(_ADMIT_WINDOWS)
        self._holds = RedisHolds(client, prefix, self._scripts)

    @classmethod
    def from_url(cls, url: str, prefix: str = "arona:", **client_kwargs: Any) -> Self:
        """Build a store owning a new client; ``client_kwargs`` go to ``Redis.from_url``."""
        client_kwargs["decode_responses"] = False
        return cls(Redis.from_url(url, **client_kwargs), prefix, owns_client=True)

    @property
    def client(self) -> Redis:
        return self._client

    @property
    def prefix(self) -> str:
        return self._prefix

    def _key(self, key: str) -> str:
        return self._prefix + key

    async def get(self, key: str) -> bytes | None:
        # The constructor refuses decoding clients, so replies are bytes.
        return cast("bytes | None", await self._client.get(self._key(key)))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        px = None if ttl is None else _ms(ttl, "ttl")
        await self._client.set(self._key(key), value, px=px)

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        px = None if ttl is None else _ms(ttl, "ttl")
        return bool(await self._client.set(self._key(key), value, px=px, nx=True))

    async def delete(self, key: str) -> bool:
        return bool(await self._client.delete(self._key(key)))

    async def exists(self, key: str) -> bool:
        return bool(await self._client.exists(self._key(key)))

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        ttl_ms = "" if ttl is None else _ms(ttl, "ttl")
        return int(await self._incr(keys=[self._key(key)], args=[amount, ttl_ms]))

    async def admit(self, key: str, amount: int, limit: int, window: float) -> WindowDecision:
        window_ms = _ms(window, "window")
        allowed, current, retry_ms = await self._admit(
            keys=[self._key(key)], args=[amount, limit, window_ms]
        )
        return WindowDecision(bool(allowed), int(current), limit, int(retry_ms) / 1000)

    async def admit_windows(
        self, windows: Sequence[WindowLimit], amount: int = 1
    ) -> MultiWindowDecision:
        check_windows(windows, amount)
        if not windows:
            return MultiWindowDecision(True, ())
        args: list[int] = [amount]
        for window in windows:
            args += [-1 if window.limit is None else window.limit, _ms(window.ttl, "ttl")]
        reply = await self._admit_windows(keys=[self._key(w.key) for w in windows], args=args)
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
        return MultiWindowDecision(bool(reply[0]), counts)

    async def reserve(
        self, windows: Sequence[ReserveWindow], hold_id: str, hold_ttl: float
    ) -> MultiWindowDecision:
        return await self._holds.reserve(windows, hold_id, hold_ttl)

    async def settle(self, hold_id: str, actuals: Mapping[str, int]) -> bool:
        return await self._holds.settle(hold_id, actuals)

    async def settle_many(self, settles: Sequence[tuple[str, Mapping[str, int]]]) -> list[bool]:
        return await self._holds.settle_many(settles)

    async def settle_part(self, hold_id: str, parts: Mapping[str, tuple[int, int]]) -> bool:
        return await self._holds.settle_part(hold_id, parts)

    async def release(self, hold_id: str) -> bool:
        return await self._holds.release(hold_id)

    async def extend(self, hold_id: str, hold_ttl: float) -> bool:
        return await self._holds.extend(hold_id, hold_ttl)

    async def window_total(self, key: str) -> WindowTotal:
        return await self._holds.window_total(key)

    async def push_sample(self, key: str, value: float, max_samples: int) -> None:
        check_max_samples(max_samples)
        k = self._key(key)
        # MULTI/EXEC: no reader ever sees the list above its bound.
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.rpush(k, repr(float(value)))
            pipe.ltrim(k, -max_samples, -1)
            await pipe.execute()

    async def samples(self, key: str) -> list[float]:
        return [float(v) for v in await self._client.lrange(self._key(key), 0, -1)]

    async def ping(self) -> bool:
        # A health check must answer, not hang on a black-holed host or raise.
        try:
            async with asyncio.timeout(_PING_TIMEOUT):
                return bool(await self._client.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        if self._owns_scripts:
            await self._scripts.close()
        if self._owns_client:
            await self._client.aclose()
