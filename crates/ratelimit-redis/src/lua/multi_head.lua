-- Multi-cost form (ratelimit-redis coalescing): inserted between the prelude and an algorithm's
-- script, which becomes the body of one_(); multi_tail.lua closes it and runs it once per cost.
-- ARGV[2] is a comma-separated list of costs (each clamped by the client to at most 2^52 + 1).
-- The costs are decided in order, each on the state the previous one left, at one instant (NOW
-- is read once): exactly as the single-cost script called once per cost at that instant.
-- Reply: the single-cost reply for each cost (six integers, or the one integer of a level reply),
-- concatenated, in order.

MULTI_ = true
local COSTS_ = {}
for c in string.gmatch(ARGV[2], '[^,]+') do COSTS_[#COSTS_ + 1] = tonumber(c) end

local function one_()
