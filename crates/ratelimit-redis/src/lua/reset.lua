-- Forgets one key's state under one limit: every Redis key a check of the limit touches (KEYS:
-- the state, then a sliding log's lists), deleted in one step. All of them carry the client's
-- hash tag, so on a cluster they are in one slot. Returns how many existed.
return redis.call('DEL', unpack(KEYS))
