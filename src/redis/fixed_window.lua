-- fixed_window(w0, c0, now, limit, p, cost)
--   state: w0 window number, c0 its count (the third state double is
--   unused); now, p: microseconds.
-- Returns: the new state's three doubles, allowed, remaining, reset (µs),
-- retry (µs), expire_at (µs).
-- Mirrors limiter.fixedStep in src/limiter/math.go line for line.
local function fixed_window(w0, c0, now, limit, p, cost)
  local w = math.floor(now / p)
  local count = 0
  if w0 == w then
    count = c0
  end
  local e = (w + 1) * p
  local allowed = fits(count, cost, limit)
  local retry = 0
  if allowed then
    count = count + cost
  else
    retry = e - now
  end
  local rem = 0
  if count < limit then
    rem = limit - count
  end
  return w, count, 0, allowed, rem, e - now, retry, e
end
