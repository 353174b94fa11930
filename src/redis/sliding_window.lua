-- sliding_window(w0, c0, p0, now, limit, p, cost, refund, overdraft, cal)
--   state: w0 current window number, c0 its count, p0 the previous
--   window's count; cal: the hit's calendar (see window), whose window's
--   own length weighs the previous one.
-- Returns: the new state's three doubles, allowed, remaining, reset (µs),
-- retry (µs), expire_at (µs), write (whether to store the new state).
-- Mirrors limiter.slidingStep, slidingWeight and slidingRetry in
-- src/limiter/math.go line for line.
local function sliding_weight(pms, ems)
  return math.floor((pms - ems) * 1000 / pms)
end

local function sliding_retry(now, start, e, e2, pms, prev, cur, cost, limit)
  if limit == 0 or cost > limit then
    return e - now
  end
  if cur + cost > limit then
    start, pms = e, (e2 - e) / 1000
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

local function sliding_window(w0, c0, p0, now, limit, p, cost, refund, overdraft, cal)
  local w, start, e, e2 = window(now, p, cal)
  local pms = (e - start) / 1000
  local cur, prev = 0, 0
  if w0 == w then
    cur, prev = c0, p0
  elseif w0 == w - 1 then
    prev = c0
  end
  local ems = math.floor((now - start) / 1000)
  local weight = sliding_weight(pms, ems)
  local used = ceil_div(prev * weight, 1000) + cur
  local allowed, write, retry = false, false, 0
  if refund and cost > 0 then
    -- Give back from the current window first, then the previous one.
    local from_cur = math.min(cur, cost)
    local from_prev = math.min(prev, cost - from_cur)
    cur, prev = cur - from_cur, prev - from_prev
    allowed, write = true, from_cur + from_prev > 0
    used = ceil_div(prev * weight, 1000) + cur
  elseif admits(used, cost, limit, overdraft) then
    allowed, write = true, true
    cur = cur + cost
    used = used + cost
  elseif overdraft then
    if cost > 0 then
      cur, write = math.min(cur + math.min(cost, MAX_COUNT), MAX_COUNT), true
      used = ceil_div(prev * weight, 1000) + cur
    end
    retry = sliding_retry(now, start, e, e2, pms, prev, cur, 1, limit)
  else
    retry = sliding_retry(now, start, e, e2, pms, prev, cur, cost, limit)
  end
  local rem = 0
  if used < limit then
    rem = limit - used
  end
  local reset = 0
  if cur > 0 then
    reset = e2 - now
  elseif prev > 0 then
    reset = e - now
  end
  return w, cur, prev, allowed, rem, reset, retry, e2, write
end
