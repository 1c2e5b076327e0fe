-- Sliding-window counter, as ratelimit_core::algorithm::sliding_window.
-- KEYS[1]: a string "<start>:<current>:<previous>" per quota, joined by ':': the current
-- window's start in microseconds, the cost admitted in it and in the window before.
-- Per-quota ARGV: limit, period_us (limit * period_us <= 2^52, checked by ratelimit-core).

local key = KEYS[1]

-- The wait until a cost c (at most the limit) passes, for one that does not pass now, `e` into
-- a window of `p` whose counts are `cur` and `prev`. A function of its own, not a closure made
-- at each check: the fast path allocates nothing but its reply.
local function wait(limit, p, e, cur, prev, c)
  if cur + c <= limit then
    -- Passes later in this window, once enough of prev has slid out.
    local room = floor((limit - cur - c) * p / prev)
    return (p - room) - e
  end
  -- Passes in the next window, where cur becomes the previous count.
  local e_next = 0
  if cur > 0 then
    e_next = p - math.min(floor((limit - c) * p / cur), p)
  end
  return (p - e) + e_next
end

-- One quota's decision. `s_start` is nil for a key never seen. Returns the outcome code, retry
-- (when allowed or never passing, the time until more is available), remaining, reset, the new
-- (start, current, previous), and the time the new state is fresh.
local function window(limit, p, s_start, s_cur, s_prev)
  local now = NOW
  local start = floor(now / p) * p
  local cur, prev = 0, 0
  if s_start then
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
  elseif COST == 0 or (cur + COST <= limit and prev * (p - e) + (cur + COST) * p <= limit * p) then
    cur = cur + COST
  else
    code = 1
    retry = wait(limit, p, e, cur, prev, COST)
  end
  local used = prev * (p - e) + cur * p
  local rem = 0
  if limit * p > used then rem = floor((limit * p - used) / p) end
  -- Allowed, or a cost that can never pass, and not full: in the retry slot, the time until
  -- more is available (one more unit than is left passes), as the core's Decision::more_after.
  if code ~= 1 and rem < limit then retry = wait(limit, p, e, cur, prev, rem + 1) end
  local reset, after = 0, start
  if cur > 0 then
    reset, after = 2 * p - e, start + 2 * p
  elseif prev > 0 then
    reset, after = p - e, start + p
  end
  return code, retry, rem, reset, start, cur, prev, after
end

if N == 1 then
  local limit, p = ARGV[5] + 0, ARGV[6] + 0
  local raw = redis.call('GET', key)
  local s_start, s_cur, s_prev
  if raw then
    local x, y, z = string.match(raw, TRIPLE)
    if not x then error(MALFORMED .. key) end
    s_start, s_cur, s_prev = x + 0, y + 0, z + 0
    if s_start >= STORED_LIMIT or s_cur >= STORED_LIMIT or s_prev >= STORED_LIMIT then
      error(MALFORMED .. key)
    end
  end
  local code, retry, rem, reset, start, cur, prev, after =
    window(limit, p, s_start, s_cur, s_prev)
  if code == 0 and COST > 0 then
    local ms = 1
    if after > NOW then ms = ceil((after - NOW) / 1000) end
    redis.call('SET', key, string.format('%d:%d:%d', start, cur, prev), 'PX', ms + SLACK_MS)
  end
  return { code, retry, limit, rem, reset, 0 }
end

--@helpers
local consider, b, load_numbers, store_numbers = helpers()
local st = load_numbers(key, 3 * N)
local new = {}
local fresh_after = 0
for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, p = ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local code, retry, rem, reset, start, cur, prev, after =
    window(limit, p, st[3 * i - 2], st[3 * i - 1], st[3 * i])
  consider(i, code, retry, limit, rem, reset)
  new[3 * i - 2], new[3 * i - 1], new[3 * i] = start, cur, prev
  if after > fresh_after then fresh_after = after end
end

if b[1] == 0 and COST > 0 then store_numbers(key, new, fresh_after) end
return b
