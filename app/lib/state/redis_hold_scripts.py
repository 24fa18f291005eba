"""The Lua scripts behind ``redis_holds`` (the key layout and the clock are described
there): what they share (``COMMON``), the reservation and the window read; the scripts
that settle, extend or end part of a hold are in ``redis_hold_settles``. Each runs
atomically; all of them judge expiry by the server's ``TIME``."""

from __future__ import annotations

# Shared by the scripts.
#
# A record field is "<units>:<window end in server ms>", the end read when the hold
# was taken. The units still count in the window only while the counter ends then:
# a window that ended (and maybe restarted) must not be charged or refunded for its
# predecessor's holds. Two readings of one end differ by the clock's rounding (a ms
# or two, more if a script runs long); a restarted window ends at least its span
# later, and spans are far longer than the tolerance.
#
# Library calls (tonumber, string.format, ipairs' iterator, math.abs) cost about a
# quarter of a redis.call each in Redis' Lua, and a settle is otherwise only a few
# dozen calls: the per-window paths use the VM's own string-to-number coercion, plain
# for loops and concatenation instead.
#
# The purge reads records one by one and deletes them in chunks, since Lua's C stack
# takes ~8000 unpacked arguments and a replica killed with thousands of calls in
# flight leaves that many holds to drop at once.
COMMON = """
local TOLERANCE_MS = 50
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The window's end, false when it has none (ended, or never given one). ``ends``
-- caches it for one script run, where many holds share few windows.
local function window_end(counter, now, ends)
  local known = ends[counter]
  if known == nil then
    local ttl = redis.call('PTTL', counter)
    known = ttl >= 0 and now + ttl
    ends[counter] = known
  end
  return known
end
-- The units a record field still holds in its window, nil once the window ended.
local function units_in(counter, field, now, ends)
  local units, reserved_end = string.match(field or '', '^(%d+):(%d+)$')
  local current_end = units and window_end(counter, now, ends)
  if not current_end then
    return nil
  end
  local drift = current_end - reserved_end
  if drift > TOLERANCE_MS or drift < -TOLERANCE_MS then
    return nil
  end
  return units + 0
end
-- Takes a dead hold's units out of the windows it still counts in (the caller
-- deletes the record).
local function release_record(record, now, ends)
  local flat = redis.call('HGETALL', record)
  for f = 1, #flat, 2 do
    local units = units_in(flat[f], flat[f + 1], now, ends)
    if units and units ~= 0 then
      redis.call('DECRBY', flat[f], units)
    end
  end
end
-- A hold is live while now <= expiry, the rule Redis applies to key expiry. Records
-- carry the ids' hash tag, the index's, so they are on its Cluster slot.
local function purge(index, record_prefix, now)
  local ids = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. now)
  if #ids == 0 then
    return
  end
  local ends, records = {}, {}
  for i, id in ipairs(ids) do
    records[i] = record_prefix .. id
    release_record(records[i], now, ends)
  end
  for s = 1, #records, 1000 do
    redis.call('DEL', unpack(records, s, math.min(s + 999, #records)))
  end
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. now)
end
-- Only ever lengthens a key's life (a key without one gets ``ms``).
local function raise_ttl(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or (ttl >= 0 and ttl < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
-- The windows of a script called on one hold: KEYS[3] onwards.
local function hold_windows()
  local counters = {}
  for i = 3, #KEYS do
    counters[i - 2] = KEYS[i]
  end
  return counters
end
-- Settle and extend share one reading of a hold. Returns 0 (unknown or expired:
-- nothing to do; an expired hold is left to the next reserve's purge) or -1 (the
-- record names other windows than ``counters``: the id was reused since the caller
-- read it), or nil and the record's field of each of ``counters``, in their order.
local function hold_fields(index, record, hold_id, counters, now)
  local expiry = redis.call('ZSCORE', index, hold_id)
  if not expiry or tonumber(expiry) < now then
    return 0, nil
  end
  local flat = redis.call('HGETALL', record)
  if #flat == 0 then
    return 0, nil
  end
  if #flat ~= 2 * #counters then
    return -1, nil
  end
  local fields = {}
  for i = 1, #counters do
    if flat[2 * i - 1] ~= counters[i] then
      fields = nil
      break
    end
    fields[i] = flat[2 * i]
  end
  if fields then
    -- callers name the windows in the record's order (the reserve's, or HKEYS')
    return nil, fields
  end
  local by_window = {}
  for f = 1, #flat, 2 do
    by_window[flat[f]] = flat[f + 1]
  end
  fields = {}
  for i = 1, #counters do
    fields[i] = by_window[counters[i]]
    if not fields[i] then
      return -1, nil
    end
  end
  return nil, fields
end
-- The hold's units in each window it still counts in become ``actuals[i]`` ('' keeps
-- them) and the hold is gone. 1 settled, 0 nothing to settle, -1 as hold_fields.
local function settle_hold(index, record, hold_id, counters, actuals, now, ends)
  local refused, fields = hold_fields(index, record, hold_id, counters, now)
  if refused then
    return refused
  end
  redis.call('DEL', record)
  redis.call('ZREM', index, hold_id)
  local settled = 0
  for i = 1, #counters do
    local counter, actual = counters[i], actuals[i]
    -- a window keeping its units needs no reading once the hold is known to count
    -- somewhere (a hold every window of which ended had nothing left to settle)
    local units = (actual ~= '' or settled == 0) and units_in(counter, fields[i], now, ends)
    if units then
      settled = 1
      if actual ~= '' then
        local delta = actual - units
        if delta ~= 0 then
          redis.call('INCRBY', counter, delta)
        end
      end
    end
  end
  return settled
end
"""

# KEYS: the hold record, the hold index of its hash tag, then each window's counter.
# Other holds' records, read by the purge, are named from the record's prefix and
# their ids: they carry the index's hash tag, so they live on its Cluster slot.
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
local record, index = KEYS[1], KEYS[2]
local expiry = redis.call('ZSCORE', index, hold_id)
if expiry and tonumber(expiry) >= now then
  return -1
end
purge(index, string.sub(record, 1, #record - #hold_id), now)
if redis.call('EXISTS', record) == 1 then
  -- an earlier hold with this id, no longer live, whose record outlived its entry
  release_record(record, now, {})
  redis.call('DEL', record)
end
local n = #KEYS - 2
local limits, spans, amounts_of = {}, {}, {}
local count = 0
for limit, span, amount in string.gmatch(ARGV[3], '(-?%d+),(%d+),(%d+)') do
  count = count + 1
  limits[count] = limit + 0
  spans[count] = span + 0
  amounts_of[count] = amount
end
if count ~= n then
  return redis.error_reply('reserve: ' .. n .. ' windows but ' .. count .. ' specs')
end
local currents, ttls, fits = {}, {}, {}
local allowed = 1
-- one MGET for the counters: a call costs more than the values it reads
local values = redis.call('MGET', unpack(KEYS, 3))
for i = 1, n do
  local counter = KEYS[i + 2]
  local limit = limits[i]
  local current = tonumber(values[i] or '0')
  if current == nil then
    return redis.error_reply('window key ' .. counter .. ' does not hold an integer')
  end
  local ttl = redis.call('PTTL', counter)
  if ttl == -1 then
    redis.call('PEXPIRE', counter, spans[i])
    ttl = spans[i]
  end
  currents[i] = current
  ttls[i] = ttl
  if limit >= 0 and current + amounts_of[i] > limit then
    fits[i] = 0
    allowed = 0
  else
    fits[i] = 1
  end
end
local out = {allowed}
if allowed == 1 then
  local hold_ms = ARGV[2] + 0
  local longest = hold_ms
  local fields = {}
  for i = 1, n do
    local counter = KEYS[i + 2]
    local amount = amounts_of[i]
    local current = redis.call('INCRBY', counter, amount)
    local ttl = ttls[i]
    if ttl == -2 then
      ttl = spans[i]
      redis.call('PEXPIRE', counter, ttl)
    end
    if ttl > longest then
      longest = ttl
    end
    fields[2 * i - 1] = counter
    -- %.14g, Lua's number format, writes integers of up to 14 digits exactly
    fields[2 * i] = amount .. ':' .. (now + ttl)
    -- counts are formatted with %d: Lua's own %.14g would write large ones as 1e+14
    out[i + 1] = string.format('1,%d,0', current)
  end
  -- the record outlives the hold while its windows last, so that a purge finds the
  -- units of a hold that expired
  redis.call('HSET', record, unpack(fields))
  redis.call('PEXPIRE', record, longest)
  redis.call('ZADD', index, now + hold_ms, hold_id)
  raise_ttl(index, longest)
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
  out[i + 1] = string.format('%d,%d,%d', fits[i], currents[i], retry)
end
return table.concat(out, ';')
"""
)


# KEYS: a window's counter, the hold index of its hash tag.
# ARGV: the records' key prefix ("<prefix>hold:").
# Returns {total, held, ttl_ms} (ttl -2: no window): the counter without the units of
# expired holds not purged yet, and the units of live holds. An admin read: it walks
# the whole index.
TOTAL = (
    COMMON
    + """
local now = now_ms()
local counter = KEYS[1]
local current = tonumber(redis.call('GET', counter) or '0')
if current == nil then
  return redis.error_reply('window key ' .. counter .. ' does not hold an integer')
end
local ttl = redis.call('PTTL', counter)
if ttl == -2 then
  return {0, 0, -2}
end
local ends = {}
local expired, held = 0, 0
local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for e = 1, #entries, 2 do
  local field = redis.call('HGET', ARGV[1] .. entries[e], counter)
  local units = field and units_in(counter, field, now, ends)
  if units then
    if tonumber(entries[e + 1]) < now then
      expired = expired + units
    else
      held = held + units
    end
  end
end
return {current - expired, held, ttl}
"""
)
