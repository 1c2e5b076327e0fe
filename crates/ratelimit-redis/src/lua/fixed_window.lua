-- Fixed window aligned to the epoch, as ratelimit_core::algorithm::fixed_window.
-- KEYS[1]: a hash with, per quota i, fields s<i> (window start, microseconds) and c<i> (count).
-- Per-quota ARGV: limit, period_us.

local key = KEYS[1]
local FIELDS = { 's1', 'c1', 's2', 'c2', 's3', 'c3', 's4', 'c4',
                 's5', 'c5', 's6', 'c6', 's7', 'c7', 's8', 'c8' }
local stored = redis.call('HMGET', key, unpack(FIELDS, 1, 2 * N))
local exists = stored[1] ~= false

local new_start, new_count = {}, {}
local fresh_before, fresh_after = 0, 0
for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, period = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local now = NOW
  local start = idiv(now, period) * period
  local count = 0
  local sv = stored[2 * i - 1]
  if sv then
    local s_start, s_count = tonumber(sv), tonumber(stored[2 * i])
    local f = s_start
    if s_count > 0 then f = s_start + period end
    if f > fresh_before then fresh_before = f end
    if s_start >= start then
      -- Same window, or the clock went back: keep counting in the stored window.
      start = s_start
      if start > now then now = start end
      count = math.min(s_count, limit)
    end
  end
  local left = period - (now - start) -- time until the window ends

  local code, retry = 0, 0
  if COST > limit then
    code = 2
  elseif count + COST <= limit then
    count = count + COST
  else
    code = 1
    retry = left
  end
  local reset = 0
  if count > 0 then reset = left end
  consider(i, code, retry, limit, limit - count, reset)
  new_start[i], new_count[i] = start, count
  local f = start
  if count > 0 then f = start + period end
  if f > fresh_after then fresh_after = f end
end

if B_CODE == 0 then
  if exists or COST > 0 then
    local args = {}
    for i = 1, N do
      args[4 * i - 3], args[4 * i - 2] = FIELDS[2 * i - 1], new_start[i]
      args[4 * i - 1], args[4 * i] = FIELDS[2 * i], new_count[i]
    end
    redis.call('HSET', key, unpack(args))
    redis.call('PEXPIRE', key, ttl_ms(fresh_after))
  end
elseif exists then
  redis.call('PEXPIRE', key, ttl_ms(fresh_before))
end
return reply()
