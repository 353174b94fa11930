-- token_bucket(tat0, now, limit, p, cost, burst): GCRA.
--   state: tat0 the theoretical arrival time (µs; the other two state
--   doubles are unused); burst 0 means limit.
-- Returns: the new state's three doubles, allowed, remaining, reset (µs),
-- retry (µs), expire_at (µs).
-- Mirrors limiter.tokenStep in src/limiter/math.go line for line.
local function token_bucket(tat0, now, limit, p, cost, burst)
  if burst == 0 then
    burst = limit
  end
  local tat = tat0
  if tat < now then
    tat = now
  end
  if limit == 0 then
    return tat, 0, 0, false, 0, tat - now, p, tat
  end
  local interval = math.floor((p + limit - 1) / limit)
  local capacity = interval * burst
  local allowed = false
  local new_tat = tat
  if cost <= burst then
    new_tat = tat + cost * interval
    allowed = new_tat - now <= capacity
  end
  local retry = 0
  if allowed then
    tat = new_tat
  elseif cost <= burst then
    retry = new_tat - now - capacity
  else
    retry = tat - now
  end
  local rem = 0
  local left = capacity - (tat - now)
  if left > 0 then
    rem = math.floor(left / interval)
  end
  return tat, 0, 0, allowed, rem, tat - now, retry, tat
end
