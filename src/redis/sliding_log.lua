-- sliding_log(blob, now, limit, p, cost, refund, overdraft)
--   state: blob, the counted hits oldest first as pairs of little-endian
--   doubles (t µs, n hits), one pair per call that counted ("" when none).
-- Returns: the new state (blob, 0, 0), allowed, remaining, reset (µs: until
-- the oldest counted hit leaves the window), retry (µs), expire_at (µs),
-- write (whether to store the new state).
-- Mirrors limiter.logStep, logAppend and logRetry in src/limiter/math.go
-- line for line: a hit at t counts while now - p < t <= now, and the log
-- keeps at most 2 * limit hits (overdraft).

local function log_retry(ts, ns, now, p, used, cost, limit)
  if limit == 0 or cost > limit then
    return p
  end
  local need = used + cost - limit
  for i = 1, #ts do
    if ns[i] >= need then
      return ts[i] + p - now
    end
    need = need - ns[i]
  end
  return p
end

local function log_append(ts, ns, now, n)
  if n == 0 then
    return
  end
  local last = #ts
  if last > 0 and ts[last] == now then
    ns[last] = ns[last] + n
    return
  end
  ts[last + 1], ns[last + 1] = now, n
end

local function sliding_log(blob, now, limit, p, cost, refund, overdraft)
  local ts, ns = {}, {}
  local used = 0
  local pos = 1
  while pos + 15 <= #blob do
    local t, n, nxt = struct.unpack('<dd', blob, pos)
    if t > now - p then
      ts[#ts + 1], ns[#ns + 1] = t, n
      used = used + n
    end
    pos = nxt
  end
  local allowed, write, retry = false, false, 0
  if refund and cost > 0 then
    -- Give back the newest hits first.
    local give = math.min(cost, used)
    write = give > 0
    while give > 0 do
      local last = #ts
      local take = math.min(ns[last], give)
      ns[last] = ns[last] - take
      give = give - take
      used = used - take
      if ns[last] == 0 then
        ts[last], ns[last] = nil, nil
      end
    end
    allowed = true
  elseif admits(used, cost, limit, overdraft) then
    allowed, write = true, true
    log_append(ts, ns, now, cost)
    used = used + cost
  elseif overdraft then
    local add = math.min(cost, 2 * limit - math.min(used, 2 * limit))
    if add > 0 then
      log_append(ts, ns, now, add)
      used = used + add
      write = true
    end
    retry = log_retry(ts, ns, now, p, used, 1, limit)
  else
    retry = log_retry(ts, ns, now, p, used, cost, limit)
  end
  local rem = 0
  if used < limit then
    rem = limit - used
  end
  local reset, exp = 0, now
  local parts = {}
  for i = 1, #ts do
    parts[i] = struct.pack('<dd', ts[i], ns[i])
  end
  if #ts > 0 then
    reset = ts[1] + p - now
    exp = ts[#ts] + p
  end
  return table.concat(parts), 0, 0, allowed, rem, reset, retry, exp, write
end
