-- batch: apply one or more decisions, each atomically, in one call.
--
-- KEYS     the counter keys of every decision, decision after decision (all
--          in one hash slot in Cluster mode)
-- ARGV     one segment per decision, in KEYS order:
--   now    microseconds since the Unix epoch, or "" to use Redis TIME
--          (production: every replica then shares Redis's clock)
--   mode   0 count each allowed hit; 1 all or nothing (count nothing if a
--          non-advisory hit is rejected); 2 dry run (never writes; allowed
--          hits report what a cost of 0 sees, as when 1 rejects)
--   n      the decision's number of hits (and keys)
--   hit*n  each hit's parameters as six little-endian doubles (48 bytes):
--          algorithm (0 fixed, 1 sliding, 2 token bucket), limit,
--          period (µs), burst, cost, advisory (0/1). One packed argument
--          instead of six halves the script's cost per hit in Redis.
--
-- Several decisions per call let the client batch concurrent requests into
-- one command (REDIS_PIPELINE_WINDOW); each decision still reads and writes
-- its keys before the next one starts, so each is exactly what it would be
-- alone, in order.
--
-- State per key is three little-endian doubles, {a, b, c} (see each
-- algorithm's st), written with SET ... PX so that it expires once it is
-- equivalent to no state: expiry only collects garbage, correctness never
-- depends on it. All values are integers below 2^53, exact as doubles.
--
-- Returns one string: 4 little-endian doubles per hit, decision after
-- decision: allowed (1/0), remaining, reset (µs), retry (µs). (One bulk
-- string costs Redis and the client less than an array of integers.) When
-- nothing is counted because of a rejection, allowed hits report what a
-- cost of 0 sees (nothing was consumed).

local function load(key)
  local v = redis.call('GET', key)
  if v and #v == 24 then
    local a, b, c = struct.unpack('<ddd', v)
    return {a, b, c}
  end
  return {0, 0, 0}
end

local function step(alg, st, now, limit, p, cost, burst)
  if alg == 1 then
    return sliding_window(st, now, limit, p, cost)
  elseif alg == 2 then
    return token_bucket(st, now, limit, p, cost, burst)
  end
  return fixed_window(st, now, limit, p, cost)
end

local function pack(out)
  return struct.pack('<' .. string.rep('d', #out), unpack(out))
end

-- apply runs one decision: its keys are KEYS[k+1..k+n], its hits
-- ARGV[a+1..a+n].
local function apply(now, mode, k, n, a)
  local stored, latest, out, writes = {}, {}, {}, {}
  local rejected = false
  for i = 1, n do
    local key = KEYS[k + i]
    local alg, limit, p, burst, cost, advisory = struct.unpack('<dddddd', ARGV[a + i])
    if stored[key] == nil then
      stored[key] = load(key)
    end
    local st, ok, rem, reset, retry, exp = step(alg, latest[key] or stored[key], now, limit, p, cost, burst)
    local j = (i - 1) * 4
    out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok and 1 or 0, rem, reset, retry
    if ok then
      latest[key] = st
      writes[#writes + 1] = {key, st, exp}
    elseif advisory == 0 then
      rejected = true
    end
  end

  if mode == 2 or (mode == 1 and rejected) then
    for i = 1, n do
      local j = (i - 1) * 4
      if out[j + 1] == 1 then
        local alg, limit, p, burst = struct.unpack('<dddd', ARGV[a + i])
        local _, ok, rem, reset, retry = step(alg, stored[KEYS[k + i]], now, limit, p, 0, burst)
        out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok and 1 or 0, rem, reset, retry
      end
    end
    return pack(out)
  end
  for _, w in ipairs(writes) do
    local st = w[2]
    local ttl = math.max(1, math.ceil((w[3] - now) / 1000))
    redis.call('SET', w[1], struct.pack('<ddd', st[1], st[2], st[3]), 'PX', ttl)
  end
  return pack(out)
end

local redis_now
local results = {}
local a, k = 1, 0
while a <= #ARGV do
  local now = ARGV[a]
  if now == '' then
    if redis_now == nil then
      local t = redis.call('TIME')
      redis_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = redis_now
  else
    now = tonumber(now)
  end
  local mode, n = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  results[#results + 1] = apply(now, mode, k, n, a + 2)
  a, k = a + 3 + n, k + n
end
return table.concat(results)
