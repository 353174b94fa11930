-- token_bucket(tat0, now, limit, p, cost, burst, refund, overdraft): GCRA.
--   state: tat0 the theoretical arrival time (µs; the other two state
--   doubles are unused); burst 0 means limit.
-- Returns: the new state's three doubles, allowed, remaining, reset (µs),
-- retry (µs), expire_at (µs), write (whether to store the new state).
-- Mirrors limiter.tokenStep in src/limiter/math.go line for line.

-- MAX_DEBT (the contract) is limiter.maxDebt: twice the longest period, in µs.

local function token_bucket(tat0, now, limit, p, cost, burst, refund, overdraft)
  if burst == 0 then
    burst = limit
  end
  local tat = tat0
  if tat < now then
    tat = now
  end
  if limit == 0 then
    if refund and cost > 0 then
      return tat, 0, 0, true, 0, tat - now, 0, tat, false
    end
    return tat, 0, 0, false, 0, tat - now, p, tat, false
  end
  local interval = math.floor((p + limit - 1) / limit)
  local capacity = interval * burst
  local allowed, write, retry = false, false, 0
  local ahead = MAX_DEBT + capacity
  if cost <= math.floor(ahead / interval) then
    ahead = cost * interval
  end
  local left = capacity - (tat - now)
  if refund and cost > 0 then
    -- Never more than a full bucket: the TAT does not go below now.
    local new_tat = math.max(tat - ahead, now)
    allowed, write = true, new_tat ~= tat
    tat = new_tat
  elseif cost <= burst and tat + ahead - now <= capacity and (not overdraft or left > 0) then
    allowed, write = true, true
    tat = tat + ahead
  elseif overdraft then
    if cost > 0 then
      tat, write = math.min(tat + ahead, now + capacity + MAX_DEBT), true
    end
    retry = tat - now - capacity + 1
  elseif cost <= burst then
    retry = tat + ahead - now - capacity
  else
    retry = tat - now
  end
  local rem = 0
  left = capacity - (tat - now)
  if left > 0 then
    rem = math.floor(left / interval)
  end
  return tat, 0, 0, allowed, rem, tat - now, retry, tat, write
end
