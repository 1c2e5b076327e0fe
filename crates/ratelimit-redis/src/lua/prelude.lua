-- ratelimit-redis: shared prelude, prepended to each algorithm's script.
--
-- Numbers are doubles, exact for integers up to 2^53. Every value below stays within 2^53
-- (ratelimit-core's Quota and Limit validation bounds them by 2^52), and every division is of
-- non-negative integers, so math.floor gives the exact integer quotient.
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
-- Atomicity: every read and every decision happens before the first write, and writes happen only
-- when every quota allows, so an error can never leave some quotas consumed and others not.

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

local floor = math.floor

-- floor(a / b) for integers a >= 0, b > 0.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 end
  return q
end

-- ceil(a / b) for integers a >= 0, b > 0.
local function ceil_div(a, b)
  local q = idiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- Milliseconds until fresh_at (microseconds), rounded up, at least 1, plus the configured slack.
local function ttl_ms(fresh_at)
  local ms = 1
  if fresh_at > NOW then
    ms = ceil_div(fresh_at - NOW, 1000)
  end
  return ms + SLACK_MS
end

-- The binding quota, exactly as ratelimit-core's Decision::combine: outcome code first
-- (exceeds > denied > allowed), then the longer retry_after among denials, then fewer remaining;
-- ties keep the earlier quota.
local B_CODE, B_RETRY, B_LIMIT, B_REM, B_RESET, B_INDEX
local function consider(i, code, retry, limit, rem, reset)
  local tighter
  if B_CODE == nil then
    tighter = true
  elseif code ~= B_CODE then
    tighter = code > B_CODE
  elseif code == 1 and retry ~= B_RETRY then
    tighter = retry > B_RETRY
  else
    tighter = rem < B_REM
  end
  if tighter then
    B_CODE, B_RETRY, B_LIMIT, B_REM, B_RESET, B_INDEX = code, retry, limit, rem, reset, i - 1
  end
end

local function reply()
  return { B_CODE, B_RETRY, B_LIMIT, B_REM, B_RESET, B_INDEX }
end
