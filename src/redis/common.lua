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

-- cal_blob and cal_base locate the calendar blocks of the decision being
-- run (its argument, and where the decision starts in it): set per
-- decision by batch.
local cal_blob, cal_base = '', 0

-- window is the window of a window algorithm's hit at now: its number,
-- start, end, and the end of the one after it (µs). cal is the hit's
-- burst field: 0 or more (a give-back's slice size) for windows aligned
-- to multiples of p since the epoch; for a calendar rule, minus the
-- offset of its calendar block from the decision's start (scriptArg in
-- scripts.go, limiter.Calendar.Bounds): the number of a window and the
-- starts of it and the three after it, then the end of the last, among
-- which now finds its own. Mirrors limiter's windowAt.
local function window(now, p, cal)
  if cal >= 0 then
    local w = math.floor(now / p)
    return w, w * p, (w + 1) * p, (w + 2) * p
  end
  local first, s0, s1, s2, s3, s4 = struct.unpack(CAL_FORMAT, cal_blob, cal_base - cal)
  local s = {s0, s1, s2, s3, s4}
  for i = 1, 3 do
    if now >= s[i] and now < s[i + 1] then
      return first + i - 1, s[i], s[i + 1], s[i + 2]
    end
  end
  error('calendar window: Redis\'s clock is more than a window away from the service\'s')
end
