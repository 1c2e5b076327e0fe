-- Sliding-window counter, as ratelimit_core::algorithm::sliding_window.
-- KEYS[1]: a hash with, per quota i, fields s<i> (current window start), c<i> (current count) and
-- p<i> (previous window's count).
-- Per-quota ARGV: limit, period_us (limit * period_us <= 2^52, checked by ratelimit-core).

local key = KEYS[1]
local FIELDS = { 's1', 'c1', 'p1', 's2', 'c2', 'p2', 's3', 'c3', 'p3', 's4', 'c4', 'p4',
                 's5', 'c5', 'p5', 's6', 'c6', 'p6', 's7', 'c7', 'p7', 's8', 'c8', 'p8' }
local stored = redis.call('HMGET', key, unpack(FIELDS, 1, 3 * N))
local exists = stored[1] ~= false

local new_start, new_cur, new_prev = {}, {}, {}
local fresh_before, fresh_after = 0, 0

local function fresh_at(start, cur, prev, p)
  if cur > 0 then return start + 2 * p end
  if prev > 0 then return start + p end
  return start
end

for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, p = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local now = NOW
  local start = idiv(now, p) * p
  local cur, prev = 0, 0
  local sv = stored[3 * i - 2]
  if sv then
    local s_start, s_cur, s_prev = tonumber(sv), tonumber(stored[3 * i - 1]), tonumber(stored[3 * i])
    local f = fresh_at(s_start, s_cur, s_prev, p)
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
      local room = idiv((limit - cur - COST) * p, prev)
      retry = (p - room) - e
    else
      -- Passes in the next window, where cur becomes the previous count.
      local e_next = 0
      if cur > 0 then
        e_next = p - math.min(idiv((limit - COST) * p, cur), p)
      end
      retry = (p - e) + e_next
    end
  end
  local used = prev * (p - e) + cur * p
  local rem = 0
  if limit * p > used then rem = idiv(limit * p - used, p) end
  local reset = 0
  if cur > 0 then
    reset = 2 * p - e
  elseif prev > 0 then
    reset = p - e
  end
  consider(i, code, retry, limit, rem, reset)
  new_start[i], new_cur[i], new_prev[i] = start, cur, prev
  local f = fresh_at(start, cur, prev, p)
  if f > fresh_after then fresh_after = f end
end

if B_CODE == 0 then
  if exists or COST > 0 then
    local args = {}
    for i = 1, N do
      args[6 * i - 5], args[6 * i - 4] = FIELDS[3 * i - 2], new_start[i]
      args[6 * i - 3], args[6 * i - 2] = FIELDS[3 * i - 1], new_cur[i]
      args[6 * i - 1], args[6 * i] = FIELDS[3 * i], new_prev[i]
    end
    redis.call('HSET', key, unpack(args))
    redis.call('PEXPIRE', key, ttl_ms(fresh_after))
  end
elseif exists then
  redis.call('PEXPIRE', key, ttl_ms(fresh_before))
end
return reply()
