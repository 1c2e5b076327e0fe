
end

local out_ = {}
for i_ = 1, #COSTS_ do
  COST = COSTS_[i_]
  local r_ = one_()
  if type(r_) == 'number' then
    out_[#out_ + 1] = r_
  elseif r_.err then
    -- A cost refused (the sliding log's `refused`, before the batch's first write): the whole
    -- batch is, with that error.
    return r_
  else
    for j_ = 1, 6 do out_[#out_ + 1] = r_[j_] end
  end
end
return out_
