-- fixed_window(st, now, limit, p, cost)
--   st: {window number, count, unused}; now, p: microseconds.
-- Returns: new state, allowed, remaining, reset (µs), retry (µs), expire_at (µs).
-- Mirrors limiter.fixedStep in src/limiter/math.go line for line.
local function fixed_window(st, now, limit, p, cost)
  local w = math.floor(now / p)
  local count = 0
  if st[1] == w then
    count = st[2]
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
  return {w, count, 0}, allowed, rem, e - now, retry, e
end
