-- sliding_log(blob, now, limit, p, cost, refund, overdraft, oldest)
--   state: blob, "" when empty, else the number of hits in it (a
--   little-endian double) and then the counted hits oldest first as pairs
--   of little-endian doubles (t µs, n hits), one pair per call that counted.
-- Returns: the new state (blob, 0, 0), allowed, remaining, reset (µs: until
-- the oldest counted hit leaves the window), retry (µs), expire_at (µs),
-- write (whether to store the new state).
-- Mirrors limiter.logStep, logAppend and logRetry in src/limiter/math.go:
-- a hit at t counts while now - p < t <= now, and the log keeps at most
-- 2 * limit hits (overdraft). A refund gives back the newest hits, or
-- with oldest (limiter.Concurrency) the oldest slots (giveNewest,
-- giveOldest). The count in front lets a call read only the
-- pairs that left the window, the ones a retry or refund walks, and the
-- last one, instead of every pair: a full log of 1,000 pairs costs Redis
-- about as much as a short one.

-- log_at returns the pair at (1-based) index i of body.
local function log_at(body, i)
  local t, n = struct.unpack('<dd', body, (i - 1) * 16 + 1)
  return t, n
end

local function log_retry(body, now, p, used, cost, limit)
  if limit == 0 or cost > limit then
    return p
  end
  local need = used + cost - limit
  for i = 1, #body / 16 do
    local t, n = log_at(body, i)
    if n >= need then
      return t + p - now
    end
    need = need - n
  end
  return p
end

-- log_append returns body with n more hits at now.
local function log_append(body, now, n)
  if n == 0 then
    return body
  end
  local count = #body / 16
  if count > 0 then
    local t, m = log_at(body, count)
    if t == now then
      return body:sub(1, #body - 16) .. struct.pack('<dd', t, m + n)
    end
  end
  return body .. struct.pack('<dd', now, n)
end

-- give_newest returns body without its newest n hits (n at most its count).
local function give_newest(body, n)
  while n > 0 do
    local count = #body / 16
    local t, m = log_at(body, count)
    local take = math.min(m, n)
    n = n - take
    body = body:sub(1, #body - 16)
    if m > take then
      body = body .. struct.pack('<dd', t, m - take)
    end
  end
  return body
end

-- give_oldest returns body without its oldest n hits (n at most its count).
local function give_oldest(body, n)
  local first = 1
  while n > 0 do
    local t, m = struct.unpack('<dd', body, first)
    if m > n then
      return struct.pack('<dd', t, m - n) .. body:sub(first + 16)
    end
    n = n - m
    first = first + 16
  end
  return body:sub(first)
end

local function sliding_log(blob, now, limit, p, cost, refund, overdraft, oldest)
  local used, first = 0, 9
  if #blob >= 8 then
    used = struct.unpack('<d', blob)
  end
  while first + 15 <= #blob do
    local t, n = struct.unpack('<dd', blob, first)
    if t > now - p then
      break
    end
    used = used - n
    first = first + 16
  end
  local body = blob:sub(first)
  local allowed, write, retry = false, false, 0
  if refund and cost > 0 then
    local give = math.min(cost, used)
    write = give > 0
    used = used - give
    if oldest then
      body = give_oldest(body, give)
    else
      body = give_newest(body, give)
    end
    allowed = true
  elseif admits(used, cost, limit, overdraft) then
    allowed, write = true, true
    body = log_append(body, now, cost)
    used = used + cost
  elseif overdraft then
    local add = math.min(cost, 2 * limit - math.min(used, 2 * limit))
    if add > 0 then
      body = log_append(body, now, add)
      used = used + add
      write = true
    end
    retry = log_retry(body, now, p, used, 1, limit)
  else
    retry = log_retry(body, now, p, used, cost, limit)
  end
  local rem = 0
  if used < limit then
    rem = limit - used
  end
  if #body == 0 then
    return '', 0, 0, allowed, rem, 0, retry, now, write
  end
  local oldest = log_at(body, 1)
  local newest = log_at(body, #body / 16)
  return struct.pack('<d', used) .. body, 0, 0, allowed, rem, oldest + p - now, retry, newest + p, write
end
