-- Fixed window aligned to the epoch, as ratelimit_core::algorithm::fixed_window.
-- KEYS[1]: a string "<start 1>:<count 1>:<start 2>:<count 2>..." per quota: the window's start
-- in microseconds (a multiple of the period) and the cost admitted in it.
-- Per-quota ARGV: limit, period_us.

local key = KEYS[1]
local st, exists = load_numbers(key, 2 * N)
local new = {}
local fresh_before, fresh_after = 0, 0
for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, period = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local now = NOW
  local start = floor(now / period) * period
  local count = 0
  if exists then
    local s_start, s_count = st[2 * i - 1], st[2 * i]
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
  new[2 * i - 1], new[2 * i] = start, count
  local f = start
  if count > 0 then f = start + period end
  if f > fresh_after then fresh_after = f end
end

if B_CODE == 0 then
  if exists or COST > 0 then store_numbers(key, new, fresh_after) end
elseif exists then
  redis.call('PEXPIRE', key, ttl_ms(fresh_before))
end
return reply()
