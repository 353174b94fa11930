-- fixed_window(w0, c0, now, limit, p, cost, refund, overdraft, countrej, cal)
--   state: w0 window number, c0 its count (the third state double is
--   unused); now, p: microseconds; cal: the hit's calendar (see window).
-- Returns: the new state's three doubles, allowed, remaining, reset (µs),
-- retry (µs), expire_at (µs), write (whether to store the new state).
-- For a rejected hit that was counted, remaining is limit - count, below
-- 0: the reply carries the count's excess over the limit that way.
-- Mirrors limiter.fixedStep in src/limiter/math.go line for line.
local function fixed_window(w0, c0, now, limit, p, cost, refund, overdraft, countrej, cal)
  local w, _, e = window(now, p, cal)
  local count = 0
  if w0 == w then
    count = c0
  end
  local allowed, write, retry = false, false, 0
  if refund and cost > 0 then
    allowed, write = true, count > 0
    count = count - math.min(count, cost)
  elseif admits(count, cost, limit, overdraft, countrej) then
    allowed, write = true, true
    count = count + cost
  else
    retry = e - now
    if (overdraft or countrej) and cost > 0 then
      count, write = math.min(count + math.min(cost, MAX_COUNT), MAX_COUNT), true
    end
  end
  local rem = 0
  if count < limit then
    rem = limit - count
  elseif write and not allowed then
    rem = limit - count -- negative: the excess of a counted rejection (Outcome.Excess)
  end
  return w, count, 0, allowed, rem, e - now, retry, e, write
end
