-- GCRA, as ratelimit_core::algorithm::gcra.
-- KEYS[1]: a string "<tat 1>:<frac 1>:<tat 2>:<frac 2>..." per quota: the TAT in whole
-- microseconds and its rest in units of 1/refill_per_micro microsecond.
-- Per-quota ARGV: burst, scale, refill_per_micro, capacity_units.

local key = KEYS[1]

if N == 1 then
  local burst, scale = ARGV[5] + 0, ARGV[6] + 0
  local rate, cap = ARGV[7] + 0, ARGV[8] + 0
  local raw = redis.call('GET', key)
  -- Debt TAT - now in level units, at most the capacity; computed without forming tat * rate.
  local d = 0
  if raw then
    local x, y = string.match(raw, PAIR)
    if not x then error(MALFORMED .. key) end
    local tat, frac = x + 0, y + 0
    if tat >= STORED_LIMIT or frac >= STORED_LIMIT then error(MALFORMED .. key) end
    if tat >= NOW then
      local ahead = tat - NOW
      if ahead > floor(cap / rate) + 1 then
        d = cap
      else
        d = math.min(ahead * rate + frac, cap)
      end
    end
  end
  local admitted = COST <= burst and d + COST * scale <= cap
  if admitted then d = d + COST * scale end
  if admitted and COST > 0 then
    local whole = floor(d / rate)
    local tat, frac = NOW + whole, d - whole * rate
    local fresh = tat
    if frac > 0 then fresh = tat + 1 end
    local ms = 1
    if fresh > NOW then ms = ceil((fresh - NOW) / 1000) end
    redis.call('SET', key, string.format('%d:%d', tat, frac), 'PX', ms + SLACK_MS)
  end
  -- The level reply (see prelude.lua), here the debt: the client derives the decision from it.
  if admitted then return d end
  return -1 - d
end

--@helpers
local consider, b, load_numbers, store_numbers = helpers()
local st, exists = load_numbers(key, 2 * N)
local new = {}
local fresh_after = 0
for i = 1, N do
  local a = 4 + (i - 1) * 4
  local burst, scale = ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local rate, cap = ARGV[a + 3] + 0, ARGV[a + 4] + 0
  local d = 0
  if exists then
    local tat, frac = st[2 * i - 1], st[2 * i]
    if tat >= NOW then
      local ahead = tat - NOW
      if ahead > floor(cap / rate) + 1 then
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
      retry = ceil((new_d - cap) / rate)
    end
  end
  consider(i, code, retry, burst, floor((cap - d) / scale), ceil(d / rate))
  local whole = floor(d / rate)
  local tat, frac = NOW + whole, d - whole * rate
  new[2 * i - 1], new[2 * i] = tat, frac
  if frac > 0 then tat = tat + 1 end
  if tat > fresh_after then fresh_after = tat end
end

if b[1] == 0 and COST > 0 then store_numbers(key, new, fresh_after) end
return b
