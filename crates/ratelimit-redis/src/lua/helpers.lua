-- ratelimit-redis: the helpers of the general path (several quotas), put in place of each
-- algorithm script's `--@helpers` line (see src/scripts.rs), after its single-quota fast path: a
-- single-quota check, by far the most common, returns before this closure is even made (making it
-- costs about 0.2 us of usec_per_call), and allocates nothing but its reply.
--
-- ttl_ms: milliseconds from NOW until the state is fresh again, rounded up, at least 1, plus
-- SLACK_MS (written inline in the fast paths).
local function helpers()
  local function ttl_ms(fresh_at)
    if fresh_at > NOW then
      return ceil((fresh_at - NOW) / 1000) + SLACK_MS
    end
    return 1 + SLACK_MS
  end

  -- The binding quota, exactly as ratelimit-core's Decision::combine: outcome code first
  -- (exceeds > denied > allowed), then the longer retry_after among denials, then fewer
  -- remaining, then a full quota (remaining = limit), then the longer reset_after; ties keep the
  -- earlier quota. An admission's retry slot (the time until more is available) is the latest of
  -- those with the fewest left. b[6]
  -- is the binding quota's index plus 256 times the bits of the quotas that did not admit the
  -- cost (bit i - 1 for quota i), which the client reads as the decision's violated quotas.
  local b = {}
  local index, violated = 0, 0
  local BITS = {1, 2, 4, 8, 16, 32, 64, 128}
  local function consider(i, code, retry, limit, rem, reset)
    if code ~= 0 then violated = violated + BITS[i] end
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
      local full, bfull = rem >= limit, b[4] >= b[3]
      if full ~= bfull then tighter = full else tighter = reset > b[5] end
      if code == 0 then
        -- Allowed with as many left as the binding quota: more comes when it comes for the last
        -- of them, never if one says none (0), as Decision::combine.
        if retry == 0 or b[2] == 0 then retry = 0 else retry = math.max(retry, b[2]) end
        b[2] = retry
      end
    end
    if tighter then
      b[1], b[2], b[3], b[4], b[5] = code, retry, limit, rem, reset
      index = i - 1
    end
    b[6] = index + 256 * violated
  end

  -- The state of the fixed-size algorithms: one string key holding every quota's numbers,
  -- joined by ':'. Returns the numbers (an empty table if the key does not exist) and whether
  -- the key exists.
  local function load_numbers(key, count)
    local raw = redis.call('GET', key)
    if not raw then return {}, false end
    -- Exactly `count` integers, as the scripts write them (at most 24: within Lua's 32 captures),
    -- or the script fails (see MALFORMED in prelude.lua).
    local v = { string.match(raw, '^' .. string.rep('(%d+):', count - 1) .. '(%d+)$') }
    if #v ~= count then error(MALFORMED .. key) end
    for j = 1, count do
      local n = v[j] + 0
      if n >= STORED_LIMIT then error(MALFORMED .. key) end
      v[j] = n
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
