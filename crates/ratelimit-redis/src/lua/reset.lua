-- Forgets one key's state under one limit: every Redis key a check of the limit touches (KEYS:
-- the state, then a sliding log's lists), deleted in one step. All of them carry the client's
-- hash tag, so on a cluster they are in one slot. With ARGV (a store that announces its resets:
-- the channel, then the notice of the key and the limit), the reset is published in the same
-- step, first, so that a user refused the channel is refused the reset with the state kept
-- (no command runs between the two, so a gateway that acts on the notice sees the keys gone).
-- Returns how many keys existed.
if #ARGV == 2 then
  -- A user that may publish but not delete would announce a reset that does not happen.
  if not redis.acl_check_cmd('del', unpack(KEYS)) then
    return redis.error_reply("NOPERM this user has no permissions to run the 'del' command on the rate limit's keys")
  end
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return redis.call('DEL', unpack(KEYS))
