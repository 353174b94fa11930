-- Helpers shared by the algorithm scripts. The scripts are concatenated in
-- this order: common.lua, fixed_window.lua, sliding_window.lua,
-- token_bucket.lua, sliding_log.lua, state.lua, lease.lua, batch.lua (see
-- scripts.go), whose batch(keys, args) Redis runs, as a function or from a
-- script. Before them all comes the wire contract (luaContract in
-- scripts.go): the names in capitals (FIXED_WINDOW, MODE_EACH,
-- FLAG_REFUND, HIT_FORMAT, MAX_COUNT, ...) are written there from the Go
-- constants they must agree with, and no file here has numbers of its own
-- for them.
--
-- All numbers are integers below 2^53 (see src/limiter/math.go), so Lua's
-- doubles compute them exactly and math.floor(a / b) is exact integer division.

-- fits mirrors limiter.fits: a limit of 0 rejects even a cost of 0.
local function fits(used, cost, limit)
  return limit > 0 and used <= limit and cost <= limit - used
end

-- admits mirrors limiter.admits: with overdraft there must be budget left;
-- counting rejected hits (countrej) asks only that the count after the hit
-- not pass the limit.
local function admits(used, cost, limit, overdraft, countrej)
  if overdraft then
    return used < limit and cost <= limit - used
  elseif countrej then
    return used <= limit and cost <= limit - used
  end
  return fits(used, cost, limit)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end
