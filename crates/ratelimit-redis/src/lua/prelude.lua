-- ratelimit-redis: shared prelude, prepended to each algorithm's script.
--
-- No shebang (`#!lua`, Redis 7's script flags), on purpose. Declared with one and without
-- `no-writes`, a script is refused before it runs on a read-only replica (READONLY), over
-- `maxmemory` with `noeviction` (OOM), with too few replicas for `min-replicas-to-write`
-- (NOREPLICAS) and after a failed RDB save (MISCONF), so a denial would fail there too, and a
-- fail-open layer would let every denied client through while it lasted. Without one, Redis
-- refuses only the first write: a denial and a peek, which write nothing, are still answered
-- (resilience.rs, a_server_refusing_writes_still_answers_denials_and_peeks). The cost: a
-- connection left on a primary demoted to a replica behind the same address is replaced only
-- when an admission's write gets READONLY, and until then answers denials and peeks from the
-- replica's data (see docs/redis.md, Connections).
--
-- Numbers are doubles, exact for integers up to 2^53. ratelimit-core's Quota and Limit
-- validation bounds every value the algorithms form by 2^52, and the client clock is refused from
-- 2^52 us on. For integers 0 <= a, b <= 2^52, math.floor(a / b) and math.ceil(a / b) are the exact
-- integer quotients: a non-integer a/b lies at least 1/b from the nearest integers, more than
-- half an ulp since (a + b) < 2^53, so the rounded division never crosses an integer.
--
-- ARGV[1]  's' to read the time from this server (TIME), or the client's time in microseconds
-- ARGV[2]  cost (clamped by the client to at most 2^52 + 1)
-- ARGV[3]  number of quotas n (1..8)
-- ARGV[4]  extra milliseconds added to every expiry (0 by default)
-- ARGV[5..] per-quota parameters, in quota order (see each algorithm)
--
-- Reply: { outcome (0 allowed, 1 denied, 2 exceeds), retry_after_us, limit, remaining,
--          reset_after_us, quota_index (0-based) + 256 * violated } for the binding quota, where
-- violated (several quotas only; 0 means the binding quota alone) has bit i - 1 set for each
-- quota i that did not admit the cost (see helpers.lua); except the level reply
-- of the single-quota token bucket and GCRA: one integer, the bucket level (GCRA: the debt) in
-- level units after an admission, or -1 - level when the cost is not admitted. Every field of
-- the decision follows from it, the cost and the quota, and ratelimit-redis derives them as
-- ratelimit-core does (src/reply.rs). A table reply measured about 0.6 us more server time.
--
-- Atomicity: every read and every decision happens before the first write, and state is written
-- only when every quota allows, so an error can never leave some quotas consumed and others not.
-- A peek (cost 0) writes nothing, and neither does a denial (the key keeps the expiry its last
-- admission set, the time its state is fresh, which a denial does not change), except that the
-- sliding log stores a total it had to recount from its log (a hash lost apart from its lists),
-- the same value it read, with the hash's expiry.

-- Numeric arguments and stored numbers are converted by arithmetic coercion (`x + 0`), which Lua
-- does inside the VM with the same conversion as tonumber() but without a function call: on a
-- script that costs a few microseconds, each call saved shows in usec_per_call. A value that is
-- not a number fails the script with an error (nothing written), as tonumber()'s nil did.

local NOW
if ARGV[1] == 's' then
  local t = redis.call('TIME')
  NOW = t[1] * 1000000 + t[2]
else
  NOW = ARGV[1] + 0
end
-- (tonumber: in the multi-cost form ARGV[2] is a list, which multi_head.lua parses.)
local COST = tonumber(ARGV[2])
local N = ARGV[3] + 0
local SLACK_MS = ARGV[4] + 0
-- The multi-cost form (multi_head.lua) sets MULTI_; the sliding log asks Redis for every write
-- command it may make once per batch (MULTI_WRITES_OK_ once granted): see sliding_log.lua.
local MULTI_, MULTI_WRITES_OK_ = false, false
local floor, ceil = math.floor, math.ceil
-- Stored state: two or three integers joined by ':', split by one string.match. Only what the
-- scripts write matches (digits, no sign): a state written by hand or by another tool, say a
-- negative level (whose level reply would read as an admission), fails the script with
-- MALFORMED in the read phase, nothing written, rather than be decided from (in the multi-cost
-- form, the read phase of the cost that reads it: a sliding-log entry that only a later cost of
-- the batch reads leaves the earlier costs' writes; docs/redis.md, "What atomic means here").
local PAIR, TRIPLE = '^(%d+):(%d+)$', '^(%d+):(%d+):(%d+)$'
local MALFORMED = 'ratelimit: malformed state (not written by these scripts): '
-- 2^53: every stored number the scripts write is below it (times below 2^52, levels, counts and
-- debts at most 2^52, see above; GCRA's arrival time, a time plus up to 2^52 us of debt, is the
-- largest, below 2^53 because the time is). A run of digits at or past it was written by someone
-- else, and a double cannot hold it exactly (2^53 + 1 reads as 2^53): MALFORMED too, not decided
-- from, nor written back (a number past 2^63 formats as a negative one).
local STORED_LIMIT = 9007199254740992
