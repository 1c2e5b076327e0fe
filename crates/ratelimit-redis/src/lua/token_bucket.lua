-- Token bucket, as ratelimit_core::algorithm::token_bucket.
-- KEYS[1]: a string "<level 1>:<last 1>:<level 2>:<last 2>..." (level in 1/scale token units,
-- last in microseconds), one pair per quota.
-- Per-quota ARGV: burst, scale, refill_per_micro, capacity_units.

local key = KEYS[1]

if N == 1 then
  local burst, scale = ARGV[5] + 0, ARGV[6] + 0
  local rate, cap = ARGV[7] + 0, ARGV[8] + 0
  local raw = redis.call('GET', key)
  local level, last = cap, NOW
  if raw then
    local x, y = string.match(raw, PAIR)
    if not x then error(MALFORMED .. key) end
    level, last = x + 0, y + 0
    if level >= STORED_LIMIT or last >= STORED_LIMIT then error(MALFORMED .. key) end
    if level > cap then level = cap end
  end
  local now = NOW
  if last > now then now = last end
  -- Compared by division, so that elapsed * rate is formed only when it is small.
  local elapsed = now - last
  if elapsed >= ceil((cap - level) / rate) then
    level = cap
  else
    level = level + elapsed * rate
  end
  local admitted = COST <= burst and level >= COST * scale
  if admitted then level = level - COST * scale end
  local reset = ceil((cap - level) / rate)
  -- Fresh at now + reset: after the commit if admitted, as stored (refilled) if not.
  if admitted and COST > 0 then
    local ms = 1
    if now + reset > NOW then ms = ceil((now + reset - NOW) / 1000) end
    redis.call('SET', key, string.format('%d:%d', level, now), 'PX', ms + SLACK_MS)
  end
  -- The level reply (see prelude.lua): the client derives the decision from it.
  if admitted then return level end
  return -1 - level
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
  local level, last = cap, NOW
  if exists then
    level, last = math.min(st[2 * i - 1], cap), st[2 * i]
  end
  local now = NOW
  if last > now then now = last end
  local elapsed = now - last
  if elapsed >= ceil((cap - level) / rate) then
    level = cap
  else
    level = level + elapsed * rate
  end

  local code, retry = 0, 0
  if COST > burst then
    code = 2
  else
    local need = COST * scale
    if level >= need then
      level = level - need
    else
      code = 1
      retry = ceil((need - level) / rate)
    end
  end
  local reset = ceil((cap - level) / rate)
  consider(i, code, retry, burst, floor(level / scale), reset)
  new[2 * i - 1], new[2 * i] = level, now
  if now + reset > fresh_after then fresh_after = now + reset end
end

if b[1] == 0 and COST > 0 then store_numbers(key, new, fresh_after) end
return b
