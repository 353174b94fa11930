-- batch: apply one request's hits atomically.
--
-- KEYS[i]  counter key of hit i (all in one hash slot in Cluster mode)
-- ARGV[1]  now in microseconds since the Unix epoch, or "" to use Redis TIME
--          (production: every replica then shares Redis's clock)
-- ARGV[2]  mode: 0 count each allowed hit; 1 all or nothing (count nothing if
--          a non-advisory hit is rejected); 2 dry run (never writes; allowed
--          hits report what a cost of 0 sees, as when 1 rejects)
-- ARGV[3+6(i-1) .. 8+6(i-1)]  for hit i: algorithm (0 fixed, 1 sliding,
--          2 token bucket), limit, period (µs), burst, cost, advisory (0/1)
--
-- State per key is the string "a:b:c" (see each algorithm's st), written
-- with SET ... PX so that it expires once it is equivalent to no state:
-- expiry only collects garbage, correctness never depends on it.
--
-- Returns a flat array, 4 integers per hit: allowed (1/0), remaining,
-- reset (µs), retry (µs). When nothing is counted because of a rejection,
-- allowed hits report what a cost of 0 sees (nothing was consumed).

local function load(key)
  local v = redis.call('GET', key)
  if v then
    local a, b, c = string.match(v, '^(%-?%d+):(%d+):(%d+)$')
    if a then
      return {tonumber(a), tonumber(b), tonumber(c)}
    end
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

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local mode = tonumber(ARGV[2])

local stored, latest, out, writes = {}, {}, {}, {}
local rejected = false
for i, key in ipairs(KEYS) do
  local a = 2 + (i - 1) * 6
  local alg, limit, p = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local burst, cost, advisory = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), ARGV[a + 6] == '1'
  if stored[key] == nil then
    stored[key] = load(key)
  end
  local st, ok, rem, reset, retry, exp = step(alg, latest[key] or stored[key], now, limit, p, cost, burst)
  local j = (i - 1) * 4
  out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok and 1 or 0, rem, reset, retry
  if ok then
    latest[key] = st
    writes[#writes + 1] = {key, st, exp}
  elseif not advisory then
    rejected = true
  end
end

if mode == 2 or (mode == 1 and rejected) then
  for i, key in ipairs(KEYS) do
    local j = (i - 1) * 4
    if out[j + 1] == 1 then
      local a = 2 + (i - 1) * 6
      local _, ok, rem, reset, retry = step(tonumber(ARGV[a + 1]), stored[key], now, tonumber(ARGV[a + 2]),
        tonumber(ARGV[a + 3]), 0, tonumber(ARGV[a + 4]))
      out[j + 1], out[j + 2], out[j + 3], out[j + 4] = ok and 1 or 0, rem, reset, retry
    end
  end
  return out
end
if mode == 2 then
  return out
end
for _, w in ipairs(writes) do
  local st = w[2]
  local ttl = math.max(1, math.ceil((w[3] - now) / 1000))
  redis.call('SET', w[1], string.format('%.0f:%.0f:%.0f', st[1], st[2], st[3]), 'PX', ttl)
end
return out
