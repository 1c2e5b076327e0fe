-- Sliding-window counter, as ratelimit_core::algorithm::sliding_window.
-- KEYS[1]: a string "<start>:<current>:<previous>" per quota, joined by ':': the current
-- window's start in microseconds, the cost admitted in it and in the window before.
-- Per-quota ARGV: limit, period_us (limit * period_us <= 2^52, checked by ratelimit-core).

local key = KEYS[1]
local st, exists = load_numbers(key, 3 * N)
local new = {}
local fresh_before, fresh_after = 0, 0

for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, p = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local now = NOW
  local start = floor(now / p) * p
  local cur, prev = 0, 0
  if exists then
    local s_start, s_cur, s_prev = st[3 * i - 2], st[3 * i - 1], st[3 * i]
    local f = s_start
    if s_cur > 0 then f = s_start + 2 * p elseif s_prev > 0 then f = s_start + p end
    if f > fresh_before then fresh_before = f end
    if s_start >= start then
      start = s_start
      if start > now then now = start end
      cur, prev = s_cur, s_prev
    elseif s_start + p == start then
      prev = s_cur
    end
  end
  cur, prev = math.min(cur, limit), math.min(prev, limit)
  local e = now - start

  local code, retry = 0, 0
  if COST > limit then
    code = 2
  elseif cur + COST <= limit and prev * (p - e) + (cur + COST) * p <= limit * p then
    cur = cur + COST
  else
    code = 1
    if cur + COST <= limit then
      -- Passes later in this window, once enough of prev has slid out.
      local room = floor((limit - cur - COST) * p / prev)
      retry = (p - room) - e
    else
      -- Passes in the next window, where cur becomes the previous count.
      local e_next = 0
      if cur > 0 then
        e_next = p - math.min(floor((limit - COST) * p / cur), p)
      end
      retry = (p - e) + e_next
    end
  end
  local used = prev * (p - e) + cur * p
  local rem = 0
  if limit * p > used then rem = floor((limit * p - used) / p) end
  local reset, f = 0, start
  if cur > 0 then
    reset, f = 2 * p - e, start + 2 * p
  elseif prev > 0 then
    reset, f = p - e, start + p
  end
  consider(i, code, retry, limit, rem, reset)
  new[3 * i - 2], new[3 * i - 1], new[3 * i] = start, cur, prev
  if f > fresh_after then fresh_after = f end
end

if B_CODE == 0 then
  if exists or COST > 0 then store_numbers(key, new, fresh_after) end
elseif exists then
  redis.call('PEXPIRE', key, ttl_ms(fresh_before))
end
return reply()
