-- sliding_window(w0, c0, p0, now, limit, p, cost)
--   state: w0 current window number, c0 its count, p0 the previous
--   window's count.
-- Returns: the new state's three doubles, allowed, remaining, reset (µs),
-- retry (µs), expire_at (µs).
-- Mirrors limiter.slidingStep, slidingWeight and slidingRetry in
-- src/limiter/math.go line for line.
local function sliding_weight(pms, ems)
  return math.floor((pms - ems) * 1000 / pms)
end

local function sliding_retry(now, start, pms, prev, cur, cost, limit)
  if limit == 0 or cost > limit then
    return start + pms * 1000 - now
  end
  if cur + cost > limit then
    start = start + pms * 1000
    prev, cur = cur, 0
  end
  local room = limit - cur - cost
  local wmax = math.floor(room * 1000 / prev)
  local x = (wmax + 1) * pms
  local elapsed = pms - math.floor(x / 1000)
  if x % 1000 == 0 then
    elapsed = elapsed + 1
  end
  local at = start + elapsed * 1000
  if at < now then
    at = now
  end
  return at - now
end

local function sliding_window(w0, c0, p0, now, limit, p, cost)
  local pms = p / 1000
  local w = math.floor(now / p)
  local cur, prev = 0, 0
  if w0 == w then
    cur, prev = c0, p0
  elseif w0 == w - 1 then
    prev = c0
  end
  local start = w * p
  local ems = math.floor((now - start) / 1000)
  local used = ceil_div(prev * sliding_weight(pms, ems), 1000) + cur
  local allowed = fits(used, cost, limit)
  local retry = 0
  if allowed then
    cur = cur + cost
    used = used + cost
  else
    retry = sliding_retry(now, start, pms, prev, cur, cost, limit)
  end
  local rem = 0
  if used < limit then
    rem = limit - used
  end
  local reset = 0
  if cur > 0 then
    reset = start + 2 * p - now
  elseif prev > 0 then
    reset = start + p - now
  end
  return w, cur, prev, allowed, rem, reset, retry, start + 2 * p
end
