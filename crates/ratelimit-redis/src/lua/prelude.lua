-- ratelimit-redis: shared prelude, prepended to each algorithm's script.
--
-- Numbers are doubles, exact for integers up to 2^53. ratelimit-core's Quota and Limit
-- validation bounds every value the algorithms form by 2^52, and the client clock is refused past
-- 2^52 us. For integers 0 <= a, b <= 2^52, math.floor(a / b) and math.ceil(a / b) are the exact
-- integer quotients: a non-integer a/b lies at least 1/b from the nearest integers, more than
-- half an ulp since (a + b) < 2^53, so the rounded division never crosses an integer.
--
-- ARGV[1]  's' to read the time from this server (TIME), or the client's time in microseconds
-- ARGV[2]  cost (clamped by the client to at most 2^52 + 1)
-- ARGV[3]  number of quotas n (1..8)
-- ARGV[4]  extra milliseconds added to every expiry (0 by default)
-- ARGV[5..] per-quota parameters, in quota order (see each algorithm)
--
-- Reply: { outcome (0 allowed, 1 denied, 2 exceeds), retry_after_us, limit, remaining,
--          reset_after_us, quota_index (0-based) } for the binding quota.
--
-- Atomicity: every read and every decision happens before the first write, and state is written
-- only when every quota allows, so an error can never leave some quotas consumed and others not.
-- A peek (cost 0) writes nothing; a denial writes nothing but the key's expiry (unchanged in
-- value: the state is as stored).

local NOW
if ARGV[1] == 's' then
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  NOW = tonumber(ARGV[1])
end
local COST = tonumber(ARGV[2])
local N = tonumber(ARGV[3])
local SLACK_MS = tonumber(ARGV[4])
local floor, ceil = math.floor, math.ceil

-- Expiry: milliseconds from NOW until the state is fresh again, rounded up, at least 1, plus
-- SLACK_MS (written inline in the single-quota fast paths, which make no closures).

-- The helpers of the general path (several quotas). They are made only when called for: a
-- single-quota check, by far the most common, takes each script's fast path and allocates
-- nothing but its reply.
local function helpers()
  local function ttl_ms(fresh_at)
    if fresh_at > NOW then
      return ceil((fresh_at - NOW) / 1000) + SLACK_MS
    end
    return 1 + SLACK_MS
  end

  -- The binding quota, exactly as ratelimit-core's Decision::combine: outcome code first
  -- (exceeds > denied > allowed), then the longer retry_after among denials, then fewer
  -- remaining, then the longer reset_after; ties keep the earlier quota.
  local b = {}
  local function consider(i, code, retry, limit, rem, reset)
    local tighter
    if b[1] == nil then
      tighter = true
    elseif code ~= b[1] then
      tighter = code > b[1]
    elseif code == 1 and retry ~= b[2] then
      tighter = retry > b[2]
    elseif rem ~= b[4] then
      tighter = rem < b[4]
    else
      tighter = reset > b[5]
    end
    if tighter then
      b[1], b[2], b[3], b[4], b[5], b[6] = code, retry, limit, rem, reset, i - 1
    end
  end

  -- The state of the fixed-size algorithms: one string key holding every quota's numbers,
  -- joined by ':'. Returns the numbers (an empty table if the key does not exist) and whether
  -- the key exists.
  local function load_numbers(key, count)
    local raw = redis.call('GET', key)
    local v = {}
    if not raw then return v, false end
    local pos = 1
    for j = 1, count do
      local sep = string.find(raw, ':', pos, true)
      if sep then
        v[j] = tonumber(string.sub(raw, pos, sep - 1))
        pos = sep + 1
      else
        v[j] = tonumber(string.sub(raw, pos))
        break
      end
    end
    return v, true
  end

  -- Writes the numbers back with their expiry, in one command.
  local function store_numbers(key, v, fresh_at)
    local s = string.format(string.rep('%d:', #v - 1) .. '%d', unpack(v))
    redis.call('SET', key, s, 'PX', ttl_ms(fresh_at))
  end

  return consider, b, load_numbers, store_numbers, ttl_ms
end
