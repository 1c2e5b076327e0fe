-- Forgets one key's state under one limit: every Redis key a check of the limit touches (KEYS:
-- the state, then a sliding log's lists), deleted in one step. All of them carry the client's
-- hash tag, so on a cluster they are in one slot. With ARGV (a store that announces its resets:
-- the channel, then the notice of the key and the limit), the reset is published in the same
-- step, once the keys are deleted, so that nothing is announced that did not happen: a user
-- refused the channel is refused the reset before anything is deleted, and a delete refused
-- (a user without `+del`, or a primary demoted to a replica: READONLY) ends the script before
-- the notice. No command runs between the two, so a gateway that acts on the notice sees the
-- keys gone. Returns how many keys existed.
if #ARGV == 2 and not redis.acl_check_cmd('publish', ARGV[1], ARGV[2]) then
  return redis.error_reply("NOPERM this user has no permissions to publish the rate limit's resets")
end
local existed = redis.call('DEL', unpack(KEYS))
if #ARGV == 2 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return existed
