-- Token bucket, as ratelimit_core::algorithm::token_bucket.
-- KEYS[1]: a hash with, per quota i, fields l<i> (level, in 1/scale token units) and t<i> (last).
-- Per-quota ARGV: burst, scale, refill_per_micro, capacity_units.

local key = KEYS[1]
local FIELDS = { 'l1', 't1', 'l2', 't2', 'l3', 't3', 'l4', 't4',
                 'l5', 't5', 'l6', 't6', 'l7', 't7', 'l8', 't8' }
local stored = redis.call('HMGET', key, unpack(FIELDS, 1, 2 * N))
local exists = stored[1] ~= false

local new_level, new_last = {}, {}
local fresh_before, fresh_after = 0, 0
for i = 1, N do
  local a = 4 + (i - 1) * 4
  local burst, scale = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local rate, cap = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local level, last = cap, NOW
  local lv = stored[2 * i - 1]
  if lv then
    level = math.min(tonumber(lv), cap)
    last = tonumber(stored[2 * i])
  end
  local now = NOW
  if last > now then now = last end
  local elapsed = now - last
  local deficit = cap - level
  if elapsed >= ceil_div(deficit, rate) then
    level = cap
  else
    level = level + elapsed * rate
  end
  local f = now + ceil_div(cap - level, rate)
  if f > fresh_before then fresh_before = f end

  local code, retry = 0, 0
  if COST > burst then
    code = 2
  else
    local need = COST * scale
    if level >= need then
      level = level - need
    else
      code = 1
      retry = ceil_div(need - level, rate)
    end
  end
  consider(i, code, retry, burst, idiv(level, scale), ceil_div(cap - level, rate))
  new_level[i], new_last[i] = level, now
  f = now + ceil_div(cap - level, rate)
  if f > fresh_after then fresh_after = f end
end

if B_CODE == 0 then
  if exists or COST > 0 then
    local args = {}
    for i = 1, N do
      args[4 * i - 3], args[4 * i - 2] = FIELDS[2 * i - 1], new_level[i]
      args[4 * i - 1], args[4 * i] = FIELDS[2 * i], new_last[i]
    end
    redis.call('HSET', key, unpack(args))
    redis.call('PEXPIRE', key, ttl_ms(fresh_after))
  end
elseif exists then
  redis.call('PEXPIRE', key, ttl_ms(fresh_before))
end
return reply()
