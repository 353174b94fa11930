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
--
-- Cost: Redis runs this for every decision of every request, so the common
-- mode (0) builds no Lua tables: state travels as three numbers, each hit
-- is read, decided and written before the next (a key that appears twice
-- in a decision then sees its own first hit, as in the other modes). Each
-- table or redis.call here costs Redis about 0.1 to 1 µs per hit.

-- load reads a key's state: three doubles (zeros when absent) and whether
-- the key was there.
local function load(key)
  local v = redis.call('GET', key)
  if v and #v == 24 then
    local a, b, c = struct.unpack('<ddd', v)
    return a, b, c, true
  end
  return 0, 0, 0, false
end

local function step(alg, s1, s2, s3, now, limit, p, cost, burst)
  if alg == 1 then
    return sliding_window(s1, s2, s3, now, limit, p, cost)
  elseif alg == 2 then
    return token_bucket(s1, now, limit, p, cost, burst)
  end
  return fixed_window(s1, s2, now, limit, p, cost)
end

-- store writes a key's new state. A window algorithm's key expires at a
-- time fixed by its window, so while the window stays the same (found, and
-- the window number, the state's first double, unchanged) the TTL already
-- set is kept: SET ... KEEPTTL costs Redis about half of SET ... PX. A
-- token bucket's expiry moves with every hit.
local function store(key, alg, found, old1, s1, s2, s3, exp, now)
  local v = struct.pack('<ddd', s1, s2, s3)
  if found and alg ~= 2 and old1 == s1 then
    redis.call('SET', key, v, 'KEEPTTL')
    return
  end
  local ttl = math.max(1, math.ceil((exp - now) / 1000))
  redis.call('SET', key, v, 'PX', ttl)
end

-- apply_each runs one decision in mode 0: its keys are KEYS[k+1..k+n],
-- its hits ARGV[a+1..a+n]; it appends each hit's result to results.
local function apply_each(now, k, n, a, results)
  for i = 1, n do
    local key = KEYS[k + i]
    local alg, limit, p, burst, cost = struct.unpack('<ddddd', ARGV[a + i])
    local s1, s2, s3, found = load(key)
    local n1, n2, n3, ok, rem, reset, retry, exp = step(alg, s1, s2, s3, now, limit, p, cost, burst)
    local allowed = 0
    if ok then
      allowed = 1
      store(key, alg, found, s1, n1, n2, n3, exp, now)
    end
    results[#results + 1] = struct.pack('<dddd', allowed, rem, reset, retry)
  end
end

-- apply_all runs one decision in mode 1 or 2: nothing is written until
-- every hit is decided, so a key that appears twice sees its first hit
-- through latest.
local function apply_all(now, mode, k, n, a, results)
  local stored, latest, out, writes = {}, {}, {}, {}
  local rejected = false
  for i = 1, n do
    local key = KEYS[k + i]
    local alg, limit, p, burst, cost, advisory = struct.unpack('<dddddd', ARGV[a + i])
    if stored[key] == nil then
      stored[key] = {load(key)} -- {s1, s2, s3, found}
    end
    local st = latest[key] or stored[key]
    local n1, n2, n3, ok, rem, reset, retry, exp = step(alg, st[1], st[2], st[3], now, limit, p, cost, burst)
    out[i] = {ok and 1 or 0, rem, reset, retry}
    if ok then
      latest[key] = {n1, n2, n3}
      writes[#writes + 1] = {key, alg, n1, n2, n3, exp}
    elseif advisory == 0 then
      rejected = true
    end
  end

  local dry = mode == 2 or rejected
  for i = 1, n do
    local o = out[i]
    if dry and o[1] == 1 then
      -- Nothing is counted: report what a cost of 0 sees.
      local alg, limit, p, burst = struct.unpack('<dddd', ARGV[a + i])
      local st = stored[KEYS[k + i]]
      local _, _, _, ok, rem, reset, retry = step(alg, st[1], st[2], st[3], now, limit, p, 0, burst)
      o = {ok and 1 or 0, rem, reset, retry}
    end
    results[#results + 1] = struct.pack('<dddd', o[1], o[2], o[3], o[4])
  end
  if not dry then
    for _, w in ipairs(writes) do
      local st = stored[w[1]]
      store(w[1], w[2], st[4], st[1], w[3], w[4], w[5], w[6], now)
    end
  end
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
  if mode == 0 then
    apply_each(now, k, n, a + 2, results)
  else
    apply_all(now, mode, k, n, a + 2, results)
  end
  a, k = a + 3 + n, k + n
end
return table.concat(results)
