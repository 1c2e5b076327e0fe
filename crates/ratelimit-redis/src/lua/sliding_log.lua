-- Sliding log, as ratelimit_core::algorithm::sliding_log.
-- KEYS[1]: a hash with, per quota i, field n<i> (sum of the costs in the log).
-- KEYS[1 + i]: quota i's log, a list of "<time_us>:<cost>" entries, oldest first; costs admitted
-- at one instant are merged into one entry.
-- Per-quota ARGV: limit, period_us.

--@helpers
local consider, b, _, _, ttl_ms = helpers()
local hkey = KEYS[1]
local FIELDS = { 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7', 'n8' }
local stored = redis.call('HMGET', hkey, unpack(FIELDS, 1, N))
local CHUNK = 32
local RECOUNT_CHUNK = 1024

local function parse(entry)
  local t, c = string.match(entry, PAIR)
  if not t then error(MALFORMED .. 'a sliding log entry ' .. entry) end
  t, c = t + 0, c + 0
  if t >= STORED_LIMIT or c >= STORED_LIMIT then
    error(MALFORMED .. 'a sliding log entry ' .. entry)
  end
  return t, c
end

-- The sum of the costs in a log. Only for a total lost apart from its log (the hash evicted or
-- deleted while the lists live on): reading 0 would admit a second limit's worth.
local function recount(lkey)
  local sum, pos = 0, 0
  while true do
    local chunk = redis.call('LRANGE', lkey, pos, pos + RECOUNT_CHUNK - 1)
    for j = 1, #chunk do
      local _, c = parse(chunk[j])
      sum = sum + c
    end
    if #chunk < RECOUNT_CHUNK then return sum end
    pos = pos + RECOUNT_CHUNK
  end
end

-- When `need` of the cost of the log `lkey` has slid out of a window of `p`: its entries still
-- in the window, oldest first (`window` holds the first of them, as (time, cost) pairs from
-- list position `pruned`; read on from the list past them, and added to it, if `any` says the
-- log has such entries), then `extra_c` at `extra_t` (an admission's own, not yet written); nil
-- if they do not hold that much (a hash whose total exceeds its lists, damaged by hand).
local function freed_at(lkey, window, pruned, any, p, need, extra_t, extra_c)
  local freed, idx = 0, 1
  local pos = pruned + #window / 2
  while true do
    if idx > #window then
      if not any then break end
      local chunk = redis.call('LRANGE', lkey, pos, pos + CHUNK - 1)
      if #chunk == 0 then break end
      for j = 1, #chunk do
        local t, c = parse(chunk[j])
        window[#window + 1] = t
        window[#window + 1] = c
      end
      pos = pos + #chunk
    end
    freed = freed + window[idx + 1]
    if freed >= need then return window[idx] + p end
    idx = idx + 2
  end
  if extra_t and freed + extra_c >= need then return extra_t + p end
  return nil
end

local plan = {}
-- Whether any quota's write appends, rewrites its newest entry, or trims (the write commands an
-- admission needs, asked for before the first write: see `refused`).
local pushes, merges, trims = false, false, false
-- Recounted totals (field, total, ...), nil until the first: a denial stores them too.
local repairs = nil
local fresh_before, fresh_after = 0, 0
for i = 1, N do
  local a = 4 + (i - 1) * 2
  local limit, p = ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local lkey = KEYS[1 + i]
  local total = 0
  local newest, newest_cost = nil, 0
  local last = redis.call('LINDEX', lkey, -1)
  if last then
    newest, newest_cost = parse(last)
    -- A total not as the scripts write it (damaged by hand) is recounted from the log, below.
    local raw = stored[i]
    total = raw and string.find(raw, '^%d+$') and raw + 0 or nil
    if total and total >= STORED_LIMIT then total = nil end
    if newest + p > fresh_before then fresh_before = newest + p end
  end
  local now = NOW
  if newest and newest > now then now = newest end

  -- Prune: count the entries from the front that have slid out (read only; trimmed on commit).
  local pruned = 0
  local window = {} -- entries still inside the window, read so far (for a denial's wait)
  if newest then
    if newest + p <= now then
      pruned = redis.call('LLEN', lkey)
      total = 0
      newest = nil
    else
      if total == nil then
        total = recount(lkey)
        repairs = repairs or {}
        repairs[#repairs + 1] = FIELDS[i]
        repairs[#repairs + 1] = total
      end
      local pos, done = 0, false
      while not done do
        local chunk = redis.call('LRANGE', lkey, pos, pos + CHUNK - 1)
        for j = 1, #chunk do
          local t, c = parse(chunk[j])
          if t + p <= now then
            pruned = pruned + 1
            total = total - c
          else
            window[#window + 1] = t
            window[#window + 1] = c
            done = true
            -- Keep the rest of this chunk: a denial may need it.
            for k = j + 1, #chunk do
              local t2, c2 = parse(chunk[k])
              window[#window + 1] = t2
              window[#window + 1] = c2
            end
            break
          end
        end
        pos = pos + CHUNK
        if #chunk < CHUNK then done = true end
      end
    end
  end

  local code, retry = 0, 0
  local merge, push = false, false
  if COST > limit then
    code = 2
  elseif COST == 0 or total + COST <= limit then
    -- A peek is always allowed, as in ratelimit-core.
    if COST > 0 then
      if newest == now then merge = true else push = true end
      total = total + COST
    end
  else
    code = 1
    -- Wait until enough of the oldest entries have slid out; at least 1 us, as in core.
    local at = freed_at(lkey, window, pruned, newest ~= nil, p, total + COST - limit)
    retry = math.max((at or now) - now, 1)
  end
  local back = newest
  if merge or push then back = now end
  local reset = 0
  if back then reset = back + p - now end
  local rem = math.max(limit - total, 0)
  if code ~= 1 and rem < limit then
    -- Allowed, or a cost that can never pass, and not full: in the retry slot, the time until
    -- more is available, when enough of the oldest entries (an admitted check's among them) have
    -- slid out for one more than is left to pass, as the core's Decision::more_after.
    local extra_t = nil
    if merge or push then extra_t = now end
    local at = freed_at(lkey, window, pruned, newest ~= nil, p, total + rem + 1 - limit, extra_t,
      COST)
    if at then retry = at - now end
  end
  consider(i, code, retry, limit, rem, reset)
  plan[i] = { lkey = lkey, pruned = pruned, merge = merge, push = push, now = now,
              cost = newest_cost + COST, total = total }
  pushes, merges, trims = pushes or push, merges or merge, trims or pruned > 0
  if back and back + p > fresh_after then fresh_after = back + p end
end

-- Refuses the check, with nothing written, if the script's user may not run `command` on the
-- rate limit's keys. Asked of each write command before the first write: a command refused
-- midway (an ACL user without `+pexpire`, say) would leave the earlier writes in place, Redis
-- not rolling a script back, and keys without expiry. Asked of the state's key alone (a user's
-- key patterns cover the log's keys too, which the read phase has read), once per command.
local function refused(command)
  if redis.acl_check_cmd(command, hkey) then return nil end
  return redis.error_reply(string.format(
    "NOPERM this user has no permissions to run the '%s' command on the rate limit's keys",
    command))
end

-- In a batch (the multi-cost form) a later cost may make a write this one does not (the first
-- cost appends an entry, the next ones, at the same instant, rewrite it), and the earlier cost's
-- writes would stay: every write command the log makes is asked for once, before the batch's
-- first write, so that a missing right refuses the whole batch with nothing written.
local function refused_in_batch()
  if MULTI_WRITES_OK_ then return nil end
  local no = refused('hset') or refused('pexpire') or refused('rpush') or refused('lset')
    or refused('ltrim')
  MULTI_WRITES_OK_ = not no
  return no
end

if b[1] == 0 then
  if COST > 0 then
    local no
    if MULTI_ then
      no = refused_in_batch()
    else
      no = refused('hset') or refused('pexpire') or (merges and refused('lset'))
        or (pushes and refused('rpush')) or (trims and refused('ltrim'))
    end
    if no then return no end
    local args = {}
    for i = 1, N do
      local pl = plan[i]
      if pl.merge then
        redis.call('LSET', pl.lkey, -1, string.format('%d:%d', pl.now, pl.cost))
      elseif pl.push then
        redis.call('RPUSH', pl.lkey, string.format('%d:%d', pl.now, COST))
      end
      -- Trimmed after the write, so that a list whose every entry slid out is never empty, and so
      -- never deleted, mid-script: a node whose slot is migrating refuses a script's command on a
      -- key it does not hold, which would cut the write phase in two.
      if pl.pruned > 0 then redis.call('LTRIM', pl.lkey, pl.pruned, -1) end
      args[2 * i - 1], args[2 * i] = FIELDS[i], pl.total
    end
    redis.call('HSET', hkey, unpack(args))
    local ttl = ttl_ms(fresh_after)
    redis.call('PEXPIRE', hkey, ttl)
    for i = 1, N do redis.call('PEXPIRE', KEYS[1 + i], ttl) end
  end
else
  -- A denial writes nothing but a recounted total (for the whole log, which a denial does not
  -- trim), so that the next checks need not recount, and that hash's expiry (a hash lost apart
  -- from its lists comes back without one; the lists keep theirs).
  if repairs then
    local no
    if MULTI_ then no = refused_in_batch() else no = refused('hset') or refused('pexpire') end
    if no then return no end
    redis.call('HSET', hkey, unpack(repairs))
    redis.call('PEXPIRE', hkey, ttl_ms(fresh_before))
  end
end
return b
