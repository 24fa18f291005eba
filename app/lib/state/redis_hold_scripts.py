"""The Lua scripts behind ``redis_holds`` (the key layout and the clock are described
there). Each runs atomically; all of them judge expiry by the server's ``TIME``."""

from __future__ import annotations

# Shared by the scripts: server time in ms, and the expired holds' purge. A purge
# unpacks ids in chunks (Lua's C stack takes ~8000 arguments) since a replica killed
# with thousands of calls in flight leaves that many to drop at once.
COMMON = """
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
-- One window's side of a settle: the hold's units there become ``actual`` ('' keeps
-- them), unless the window ended meanwhile, and the hold leaves the window.
local function settle_window(counter, expiries, amounts, hold_id, actual)
  local reserved = tonumber(redis.call('HGET', amounts, hold_id) or '0')
  if actual ~= '' and redis.call('EXISTS', counter) == 1 then
    local delta = tonumber(actual) - reserved
    if delta ~= 0 then
      redis.call('INCRBY', counter, delta)
    end
  end
  redis.call('ZREM', expiries, hold_id)
  redis.call('HDEL', amounts, hold_id)
end
-- Settle and extend share one reading of a hold (KEYS: its record, then per window:
-- counter, expiries, amounts). Returns 0 (unknown or expired: nothing to do) or -1
-- (the record names other windows: the id was reused since the caller read it), or
-- nil and the windows (by index) the hold is still live in, possibly none.
local function live_windows(hold_id, now)
  local n = (#KEYS - 1) / 3
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0, nil
  end
  if redis.call('HLEN', KEYS[1]) ~= n then
    return -1, nil
  end
  local present = {}
  for i = 1, n do
    if redis.call('HEXISTS', KEYS[1], KEYS[3 * i - 1]) == 0 then
      return -1, nil
    end
    local expiry = redis.call('ZSCORE', KEYS[3 * i], hold_id)
    if expiry then
      if tonumber(expiry) < now then
        -- expired: the next reserve on the window purges it
        return 0, nil
      end
      present[i] = true
    end
  end
  return nil, present
end
"""

# KEYS: the hold record, then each window's counter. Its expiries and amounts keys are
# derived from the counter's name here (the same suffixes as ``redis_holds``): they
# carry its hash tag, so they live on its Redis Cluster slot, and naming three keys
# per window instead of one was a third of a caller's cost per call.
# ARGV: hold_id, hold_ms, and the windows packed in one argument,
# "<limit>,<window_ms>,<amount>;..." (limit -1 = none): one argument instead of three
# per window, since packing arguments is most of a caller's cost.
# Returns -1 when the hold id is live, else one string
# "<allowed>;<fits>,<current>,<retry_ms>;..." (one bulk reply, not 1 + 3 per window).
RESERVE = (
    COMMON
    + """
local now = now_ms()
local hold_id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
local n = #KEYS - 1
local limits, spans, amounts_of = {}, {}, {}
for limit, span, amount in string.gmatch(ARGV[3], '(-?%d+),(%d+),(%d+)') do
  limits[#limits + 1] = tonumber(limit)
  spans[#spans + 1] = tonumber(span)
  amounts_of[#amounts_of + 1] = amount
end
if #limits ~= n then
  return redis.error_reply('reserve: ' .. n .. ' windows but ' .. #limits .. ' specs')
end
local currents, ttls, fits = {}, {}, {}
local allowed = 1
for i = 1, n do
  local counter = KEYS[i + 1]
  local expiries, amounts = counter .. '|hold-expiry', counter .. '|hold-amount'
  local limit = limits[i]
  local window_ms = spans[i]
  local amount = tonumber(amounts_of[i])
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
local out = {tostring(allowed)}
if allowed == 1 then
  local expires = now + tonumber(ARGV[2])
  for i = 1, n do
    local counter = KEYS[i + 1]
  local expiries, amounts = counter .. '|hold-expiry', counter .. '|hold-amount'
    local amount = amounts_of[i]
    local current = redis.call('INCRBY', counter, amount)
    local ttl = ttls[i]
    if ttl == -2 then
      ttl = spans[i]
      redis.call('PEXPIRE', counter, ttl)
    end
    redis.call('ZADD', expiries, expires, hold_id)
    redis.call('HSET', amounts, hold_id, amount)
    redis.call('PEXPIRE', expiries, ttl)
    redis.call('PEXPIRE', amounts, ttl)
    redis.call('HSET', KEYS[1], counter, amount)
    out[#out + 1] = string.format('1,%d,0', current)
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return table.concat(out, ';')
end
for i = 1, n do
  local retry = 0
  if fits[i] == 0 then
    retry = ttls[i]
    if retry == -2 then
      retry = spans[i]
    elseif retry < 1 then
      retry = 1
    end
  end
  out[#out + 1] = string.format('%d,%d,%d', fits[i], currents[i], retry)
end
return table.concat(out, ';')
"""
)


# KEYS: the hold record, then per window of the hold: counter, expiries, amounts.
# ARGV: hold_id, then per window: the actual units, or '' to keep the reserved ones.
# Returns 1 settled, 0 unknown or expired (nothing changed), -1 the record no longer
# names these windows (the id was reused since the caller read it: read again).
SETTLE = (
    COMMON
    + """
local now = now_ms()
local hold_id = ARGV[1]
local n = (#KEYS - 1) / 3
local refused, present = live_windows(hold_id, now)
if refused then
  return refused
end
redis.call('DEL', KEYS[1])
if next(present) == nil then
  -- every window of the hold ended: there is nothing left to settle
  return 0
end
for i = 1, n do
  if present[i] then
    settle_window(KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1], hold_id, ARGV[i + 1])
  end
end
return 1
"""
)

# KEYS: counter, expiries, amounts. Returns {total, held, ttl_ms} (ttl -2: no window).
TOTAL = (
    COMMON
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

# KEYS: the hold record, then per window of the hold: counter, expiries, amounts.
# ARGV: hold_id, hold_ms. Moves a live hold's end to now + hold_ms. Returns 1, 0
# (unknown, expired or every window ended: nothing changed) or -1 (as SETTLE).
EXTEND = (
    COMMON
    + """
local now = now_ms()
local hold_id = ARGV[1]
local n = (#KEYS - 1) / 3
local refused, present = live_windows(hold_id, now)
if refused then
  return refused
end
if next(present) == nil then
  return 0
end
local expires = now + tonumber(ARGV[2])
for i = 1, n do
  if present[i] then
    redis.call('ZADD', KEYS[3 * i], 'XX', expires, hold_id)
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# Many holds settled in one call, each exactly as SETTLE would (a batch of the calls
# that ended together; their windows are mostly the same few, named once).
# KEYS: the holds' records (ARGV[1] of them), then the windows' triples (counter,
# expiries, amounts) that any of them held in.
# ARGV: the number of holds, then per hold "<hold_id>\n<w>=<actual>,<w>=<actual>..."
# with <w> the 1-based index of a window triple and <actual> empty to keep the
# reserved units. Returns per hold what SETTLE returns: 1, 0 or -1.
SETTLE_MANY = (
    COMMON
    + """
local now = now_ms()
local holds = tonumber(ARGV[1])
local out = {}
for h = 1, holds do
  local spec = ARGV[h + 1]
  local cut = string.find(spec, '\\n', 1, true)
  local hold_id = string.sub(spec, 1, cut - 1)
  local record = KEYS[h]
  local firsts, actuals = {}, {}
  for w, actual in string.gmatch(string.sub(spec, cut + 1), '(%d+)=(%d*)') do
    firsts[#firsts + 1] = holds + 3 * tonumber(w) - 2
    actuals[#actuals + 1] = actual
  end
  local result = nil
  local present = {}
  if redis.call('EXISTS', record) == 0 then
    result = 0
  elseif redis.call('HLEN', record) ~= #firsts then
    result = -1
  else
    for j = 1, #firsts do
      local counter = KEYS[firsts[j]]
      if redis.call('HEXISTS', record, counter) == 0 then
        result = -1
        break
      end
      local expiry = redis.call('ZSCORE', KEYS[firsts[j] + 1], hold_id)
      if expiry then
        if tonumber(expiry) < now then
          result = 0
          break
        end
        present[j] = true
      end
    end
  end
  if result == nil then
    redis.call('DEL', record)
    result = 0
    for j = 1, #firsts do
      if present[j] then
        result = 1
        local w = firsts[j]
        settle_window(KEYS[w], KEYS[w + 1], KEYS[w + 2], hold_id, actuals[j])
      end
    end
  end
  out[h] = result
end
return out
"""
)
