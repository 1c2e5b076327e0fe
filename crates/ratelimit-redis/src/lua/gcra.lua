-- GCRA, as ratelimit_core::algorithm::gcra.
-- KEYS[1]: a hash with, per quota i, fields a<i> (TAT, whole microseconds) and f<i> (the rest of
-- the TAT, in units of 1/refill_per_micro microsecond).
-- Per-quota ARGV: burst, scale, refill_per_micro, capacity_units.

local key = KEYS[1]
local FIELDS = { 'a1', 'f1', 'a2', 'f2', 'a3', 'f3', 'a4', 'f4',
                 'a5', 'f5', 'a6', 'f6', 'a7', 'f7', 'a8', 'f8' }
local stored = redis.call('HMGET', key, unpack(FIELDS, 1, 2 * N))
local exists = stored[1] ~= false

local new_tat, new_frac = {}, {}
local fresh_before, fresh_after = 0, 0
for i = 1, N do
  local a = 4 + (i - 1) * 4
  local burst, scale = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local rate, cap = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  -- Debt TAT - now in level units, at most the capacity; computed without forming tat * rate.
  local d = 0
  local sv = stored[2 * i - 1]
  if sv then
    local tat, frac = tonumber(sv), tonumber(stored[2 * i])
    local f = tat
    if frac > 0 then f = tat + 1 end
    if f > fresh_before then fresh_before = f end
    if tat >= NOW then
      local ahead = tat - NOW
      if ahead > idiv(cap, rate) + 1 then
        d = cap
      else
        d = math.min(ahead * rate + frac, cap)
      end
    end
  end

  local code, retry = 0, 0
  if COST > burst then
    code = 2
  else
    local new_d = d + COST * scale
    if new_d <= cap then
      d = new_d
    else
      code = 1
      retry = ceil_div(new_d - cap, rate)
    end
  end
  consider(i, code, retry, burst, idiv(cap - d, scale), ceil_div(d, rate))
  local whole = idiv(d, rate)
  local tat, frac = NOW + whole, d - whole * rate
  new_tat[i], new_frac[i] = tat, frac
  if frac > 0 then tat = tat + 1 end
  if tat > fresh_after then fresh_after = tat end
end

if B_CODE == 0 then
  if exists or COST > 0 then
    local args = {}
    for i = 1, N do
      args[4 * i - 3], args[4 * i - 2] = FIELDS[2 * i - 1], new_tat[i]
      args[4 * i - 1], args[4 * i] = FIELDS[2 * i], new_frac[i]
    end
    redis.call('HSET', key, unpack(args))
    redis.call('PEXPIRE', key, ttl_ms(fresh_after))
  end
elseif exists then
  redis.call('PEXPIRE', key, ttl_ms(fresh_before))
end
return reply()
