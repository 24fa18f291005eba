"""The Lua scripts that settle, extend or end part of a live hold (``redis_holds``;
what they share, ``COMMON``, is in ``redis_hold_scripts``)."""

from __future__ import annotations

from app.lib.state.redis_hold_scripts import COMMON

# KEYS: the hold index, the hold record, then each window's counter.
# ARGV: hold_id, then per window: the actual units, or '' to keep the reserved ones.
# Returns 1 settled, 0 unknown, expired or every window ended (nothing changed), -1
# the record no longer names these windows (the id was reused since the caller read
# it: read again).
SETTLE = (
    COMMON
    + """
local counters, actuals = {}, {}
for i = 3, #KEYS do
  counters[i - 2] = KEYS[i]
  actuals[i - 2] = ARGV[i - 1]
end
return settle_hold(KEYS[1], KEYS[2], ARGV[1], counters, actuals, now_ms(), {})
"""
)

# A part of a live hold ends and the hold stays (a lease's calls end one by one).
# KEYS: the hold index, the hold record, then each window's counter.
# ARGV: hold_id, then "<held>,<actual>;..." per window in KEYS' order: up to <held>
# units leave the hold there and the counter counts <actual> in their place.
# Returns 1 done, 0 unknown, expired or every window ended (nothing changed), -1 the
# record no longer names these windows (as SETTLE).
SETTLE_PART = (
    COMMON
    + """
local now = now_ms()
local record = KEYS[2]
local counters = hold_windows()
local refused, fields = hold_fields(KEYS[1], record, ARGV[1], counters, now)
if refused then
  return refused
end
local ends = {}
local counted = 0
local i = 0
for held, actual in string.gmatch(ARGV[2], '(%d+),(%d+)') do
  i = i + 1
  local counter, field = counters[i], fields[i]
  local units = units_in(counter, field, now, ends)
  if units then
    counted = 1
    local taken = held + 0
    if taken > units then
      taken = units
    end
    local delta = actual - taken
    if delta ~= 0 then
      redis.call('INCRBY', counter, delta)
    end
    if taken ~= 0 then
      redis.call('HSET', record, counter, (units - taken) .. string.match(field, ':%d+$'))
    end
  end
end
if i ~= #counters then
  return redis.error_reply('settle_part: ' .. #counters .. ' windows but ' .. i .. ' parts')
end
return counted
"""
)

# KEYS: the hold index, the hold record, then each window's counter.
# ARGV: hold_id, hold_ms. Moves a live hold's end to now + hold_ms. Returns 1, 0
# (unknown, expired or every window ended: nothing changed) or -1 (as SETTLE).
EXTEND = (
    COMMON
    + """
local now = now_ms()
local hold_id = ARGV[1]
local counters = hold_windows()
local refused, fields = hold_fields(KEYS[1], KEYS[2], hold_id, counters, now)
if refused then
  return refused
end
local ends = {}
local counting = false
for i = 1, #counters do
  if units_in(counters[i], fields[i], now, ends) then
    counting = true
    break
  end
end
if not counting then
  return 0
end
local hold_ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + hold_ms, hold_id)
raise_ttl(KEYS[2], hold_ms)
raise_ttl(KEYS[1], hold_ms)
return 1
"""
)

# Many holds of one hash tag settled in one call, each exactly as SETTLE would (a
# batch of the calls that ended together; their windows are mostly the same few,
# named once).
# KEYS: the hold index, the holds' records (ARGV[1] of them), then the counters of
# the windows any of them held in.
# ARGV: the number of holds, then per hold "<hold_id>\n<w>=<actual>,<w>=<actual>..."
# with <w> the 1-based index of a counter and <actual> empty to keep the reserved
# units. Returns per hold what SETTLE returns: 1, 0 or -1.
SETTLE_MANY = (
    COMMON
    + """
local now = now_ms()
local index = KEYS[1]
local holds = tonumber(ARGV[1])
local ends = {}
local out = {}
for h = 1, holds do
  local spec = ARGV[h + 1]
  local cut = string.find(spec, '\\n', 1, true)
  local hold_id = string.sub(spec, 1, cut - 1)
  local counters, actuals = {}, {}
  for w, actual in string.gmatch(string.sub(spec, cut + 1), '(%d+)=(%d*)') do
    counters[#counters + 1] = KEYS[1 + holds + tonumber(w)]
    actuals[#actuals + 1] = actual
  end
  out[h] = settle_hold(index, KEYS[h + 1], hold_id, counters, actuals, now, ends)
end
return out
"""
)
