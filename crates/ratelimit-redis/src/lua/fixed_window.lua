-- Fixed window aligned to the epoch, as ratelimit_core::algorithm::fixed_window.
-- KEYS[1]: a string "<start 1>:<count 1>:<start 2>:<count 2>..." per quota: the window's start
-- in microseconds (a multiple of the period) and the cost admitted in it.
-- Per-quota ARGV: limit, period_us.

local key = KEYS[1]

-- One quota's decision. `s_start` is nil for a key never seen. Returns the outcome code, retry,
-- remaining, reset, the new (start, count), and the time the new state is fresh.
local function window(limit, period, s_start, s_count)
  local now = NOW
  local start = floor(now / period) * period
  local count = 0
  if s_start then
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
  local reset, after = 0, start
  if count > 0 then reset, after = left, start + period end
  return code, retry, limit - count, reset, start, count, after
end

if N == 1 then
  local limit, period = ARGV[5] + 0, ARGV[6] + 0
  local raw = redis.call('GET', key)
  local s_start, s_count
  if raw then
    local x, y = string.match(raw, PAIR)
    if not x then error(MALFORMED .. key) end
    s_start, s_count = x + 0, y + 0
    if s_start >= STORED_LIMIT or s_count >= STORED_LIMIT then error(MALFORMED .. key) end
  end
  local code, retry, rem, reset, start, count, after = window(limit, period, s_start, s_count)
  if code == 0 and COST > 0 then
    local ms = 1
    if after > NOW then ms = ceil((after - NOW) / 1000) end
    redis.call('SET', key, string.format('%d:%d', start, count), 'PX', ms + SLACK_MS)
  end
  return { code, retry, limit, rem, reset, 0 }
end

--@helpers
local consider, b, load_numbers, store_numbers = helpers()
local st = load_numbers(key, 2 * N)
local new = {}
local fresh_after = 0
for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, period = ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local code, retry, rem, reset, start, count, after =
    window(limit, period, st[2 * i - 1], st[2 * i])
  consider(i, code, retry, limit, rem, reset)
  new[2 * i - 1], new[2 * i] = start, count
  if after > fresh_after then fresh_after = after end
end

if b[1] == 0 and COST > 0 then store_numbers(key, new, fresh_after) end
return b
