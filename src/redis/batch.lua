-- batch: apply one or more decisions, each atomically, in one call
-- (batch(keys, args) at the end; keys and args are KEYS and ARGV below).
--
-- KEYS     the counter keys of every decision, decision after decision (all
--          in one hash slot in Cluster mode)
-- ARGV     the decisions, in KEYS order, each a header (HEADER_FORMAT: now,
--          mode, n, jitter, calb), then n hits (HIT_FORMAT, HIT_BYTES each),
--          then calb bytes of calendar blocks (see window); an argument
--          holds one decision or several back to back (a batch's are all
--          in one). The names in capitals are the wire contract, written
--          from Go's constants before these files (see common.lua).
--   now    microseconds since the Unix epoch, or REDIS_TIME to use Redis
--          TIME (production: every replica then shares Redis's clock)
--   mode   MODE_EACH counts each allowed hit (and each overdraft or
--          count-rejected hit, and each refund); MODE_ALL_OR_NOTHING
--          (limiter.Decide) counts nothing if a non-advisory hit that
--          neither overdraws nor counts rejections is rejected, and only
--          overdraft hits, refunds and rejected count-rejected hits if only
--          such hits are; MODE_DRY_RUN never writes. A hit that is not
--          written reports what a cost of 0 sees, with its own decision.
--   n      the decision's number of hits (and keys)
--   jitter milliseconds added to every TTL the decision sets (ttl_ms)
--   hit*n  each hit's parameters: algorithm (FIXED_WINDOW, SLIDING_WINDOW,
--          TOKEN_BUCKET, SLIDING_LOG, CONCURRENCY), limit, period (µs), burst, cost,
--          flags (the sum of FLAG_ADVISORY, FLAG_REFUND, FLAG_OVERDRAFT,
--          FLAG_COUNT_REJECTED as they apply, plus FLAG_LEASE * lease).
--          One packed argument instead of six halves the script's cost
--          per hit in Redis. lease (see
--          lease.go): on an allowed hit of a window algorithm, up to that
--          many more hits to count now as a slice the replica spends
--          locally; on a refund, 1 + the window number of the slice it
--          gives back (see lease_return; its answer means nothing), its
--          unspent hits as the cost and its size in the burst field
--          (see give_back).
--
-- Several decisions per call let the client batch concurrent requests into
-- one command (REDIS_PIPELINE_WINDOW); each decision still reads and writes
-- its keys before the next one starts, so each is exactly what it would be
-- alone, in order.
--
-- State: a fixed window's count is an integer under KEY|w, w the window's
-- number (win_key), which expires when its window ends; a sliding window's and
-- a token bucket's state is three little-endian doubles under KEY, {a, b,
-- c} (see each algorithm's st); a sliding log's is a blob of (t, n)
-- pairs. Each is written so that it expires once it is equivalent to no
-- state: expiry only collects garbage, correctness never depends on it.
-- All values are integers below 2^53, exact as doubles. Every key a
-- script writes is one of its KEYS (or KEY|h beside one, see held_key),
-- so Redis Cluster finds the state where the key is, resharding included.
--
-- Returns one string: 4 little-endian doubles per hit, decision after
-- decision: allowed (1 + the slice granted, or 0), remaining, reset (µs),
-- retry (µs; for a granted slice, the window number it was counted in,
-- which a give-back names). (One bulk
-- string costs Redis and the client less than an array of integers.) When
-- nothing is counted because of a rejection, allowed hits report what a
-- cost of 0 sees (nothing was consumed).
--
-- Cost: Redis runs this for every decision of every request, so the common
-- mode (0) builds no Lua tables but the reply's numbers: state travels as
-- three numbers, each hit is read, decided and written before the next (a
-- key that appears twice in a decision then sees its own first hit, as in
-- the other modes). A
-- redis.call costs more than all the arithmetic of a hit, so the common
-- hit of a fixed window takes one (fixed_incr); docs/performance.md has
-- the figures.

-- (int_str, ttl_ms, load, step and flags are in state.lua; the lease
-- functions in lease.lua: both are appended before this file.)

-- store writes a key's new state (old1, old2: the state's first two
-- doubles as read). SET ... KEEPTTL costs Redis about half of SET ... PX,
-- so a TTL already set is kept where it still fits. A window algorithm's
-- key expires at a time fixed by its window: kept while the window stays
-- the same (found, and the window number, the state's first double,
-- unchanged). A token bucket's must outlive its tat, which moves with
-- every hit: its TTL is set with room to spare (as long again, at least a
-- second), the instant it runs to kept as the state's second double, and
-- kept while the tat stays within it.
local function store(key, alg, found, old1, old2, s1, s2, s3, exp, now)
  if alg == FIXED_WINDOW then
    local wk = win_key(key, s1)
    if found then
      redis.call('SET', wk, int_str(s2), 'KEEPTTL')
    else
      redis.call('SET', wk, int_str(s2), 'PX', int_str(ttl_ms(exp)))
    end
    return
  elseif alg == SLIDING_LOG or alg == CONCURRENCY then
    -- A log's expiry moves with its newest hit; an empty one goes.
    if s1 == '' then
      if found then
        redis.call('DEL', key)
      end
      return
    end
    redis.call('SET', key, s1, 'PX', ttl_ms(exp))
    return
  end
  if alg == TOKEN_BUCKET then
    if found and old2 >= exp then
      redis.call('SET', key, struct.pack('<ddd', s1, old2, 0), 'KEEPTTL')
      return
    end
    local untl = exp + math.max(exp - now, 1000000)
    redis.call('SET', key, struct.pack('<ddd', s1, untl, 0), 'PX', int_str(ttl_ms(untl)))
    return
  end
  local v = struct.pack('<ddd', s1, s2, s3)
  if found and old1 == s1 then
    redis.call('SET', key, v, 'KEEPTTL')
    return
  end
  redis.call('SET', key, v, 'PX', ttl_ms(exp))
end

-- The reply is built as numbers and packed once, at the end of the call
-- (pack_results): a string per hit, then their concatenation, cost Redis
-- an interned string each (Lua hashes every byte of every string it makes).
-- results.n counts the numbers put so far.

-- put appends one hit's answer: allowed, remaining, reset, retry.
local function put(results, a, b, c, d)
  local n = results.n
  results[n + 1], results[n + 2], results[n + 3], results[n + 4] = a, b, c, d
  results.n = n + 4
end

-- put_grant appends a granted slice's fifth double, its generation.
local function put_grant(results, g)
  local n = results.n + 1
  results[n] = g
  results.n = n
end

-- pack_fmts caches struct.pack's format for a count of doubles (a
-- function's library outlives its calls, so the formats are made once).
local pack_fmts = {}
local PACK_CHUNK = 1024 -- numbers per unpack: Lua's C stack takes 8,000 at most

local function pack_fmt(n)
  local f = pack_fmts[n]
  if f == nil then
    f = '<' .. string.rep('d', n)
    pack_fmts[n] = f
  end
  return f
end

-- pack_results is the call's reply: every number put, as little-endian
-- doubles, in order.
local function pack_results(results)
  local n = results.n
  if n <= PACK_CHUNK then
    return struct.pack(pack_fmt(n), unpack(results, 1, n))
  end
  local parts = {}
  for i = 1, n, PACK_CHUNK do
    local j = math.min(i + PACK_CHUNK - 1, n)
    parts[#parts + 1] = struct.pack(pack_fmt(j - i + 1), unpack(results, i, j))
  end
  return table.concat(parts)
end

-- fixed_incr is fixed_window for the common hit of a rule that drops
-- rejected hits (no refund, overdraft, count-rejected or lease; advisory
-- changes nothing in mode 0) in one command: INCRBY
-- counts it, and a rejected hit is taken back (DECRBY, or DEL of
-- the key it created) before the script goes on, so nothing else ever
-- sees it: it consumes nothing. fixed_window decides it from the count
-- before it, so the arithmetic is written once. Returns the hit's answer
-- (see put).
local function fixed_incr(key, now, limit, p, cost, cal)
  local w, _, e = window(now, p, cal)
  local wk = win_key(key, w)
  local c = redis.call('INCRBY', wk, int_str(cost))
  local _, _, _, ok, rem, reset, retry = fixed_window(w, c - cost, now, limit, p, cost, false, false, false, cal)
  if ok then
    if c == cost then
      -- The window's first count (or its count was refunded to 0: the
      -- same TTL again).
      new_window(wk, e)
    end
  elseif c == cost then
    redis.call('DEL', wk)
  elseif cost > 0 then
    redis.call('DECRBY', wk, int_str(cost))
  end
  return ok and 1 or 0, rem, reset, retry
end

-- fixed_count is fixed_window for the common hit of a rule that counts
-- rejected hits (count-rejected, no refund, overdraft or lease; advisory
-- changes nothing in mode 0): INCRBY counts it whether or not it fits, as
-- envoyproxy/ratelimit does, and it is rejected when the count passes the
-- limit. A check (cost 0) only reads. fixed_window decides it from the
-- count before it. Returns the hit's answer (see put).
local function fixed_count(key, now, limit, p, cost, cal)
  local w, _, e = window(now, p, cal)
  local wk = win_key(key, w)
  local before
  if cost > 0 then
    local c = redis.call('INCRBY', wk, int_str(cost))
    if c == cost then
      new_window(wk, e)
    end
    if c > MAX_COUNT then
      redis.call('SET', wk, int_str(MAX_COUNT), 'KEEPTTL')
    end
    before = math.max(c - cost, 0)
  else
    before = tonumber(redis.call('GET', wk) or '0')
  end
  local _, _, _, ok, rem, reset, retry = fixed_window(w, before, now, limit, p, cost, false, false, true, cal)
  return ok and 1 or 0, rem, reset, retry
end

-- apply_hit applies one hit of mode 0 that fixed_incr and fixed_count do
-- not take, and puts its answer into results.
local function apply_hit(key, now, alg, limit, p, burst, cost, f, results)
  local _, refund, overdraft, countrej, lease = flags(f)
  local s1, s2, s3, found = load(key, alg, state_window(now, p, refund, lease, burst))
  local n1, n2, n3, ok, rem, reset, retry, exp, write, h = decide_hit(key, found, no_held, alg, s1, s2, s3, now, limit, p, cost,
    burst, refund, overdraft, countrej, lease)
  if h then -- a give-back: the key's TTL stays
    store_held(key, h[1], h[2], h[3], h[4], nil, now)
  end
  local extra, g = 0, 0
  if ok and write and lease > 0 and not refund then
    n2, rem, extra = lease_grant(n2, rem, lease)
    if extra > 0 then
      reset, retry = exp - now, n1
      h = held_grant(alg, no_held(key, found), n1, extra, now)
      g = h[4]
      store_held(key, h[1], h[2], h[3], g, exp, now)
    end
  end
  if write then
    store(key, alg, found, s1, s2, n1, n2, n3, exp, now)
  end
  put(results, ok and 1 + extra or 0, rem, reset, retry)
  if extra > 0 then
    put_grant(results, g) -- a grant's fifth double: its generation
  end
end

-- apply_each runs one decision in mode 0: its keys are keys[k+1..k+n],
-- its hits in blob from pos on; it puts each hit's answer into results.
local function apply_each(keys, now, k, n, blob, pos, results)
  for i = 1, n do
    local key = keys[k + i]
    local alg, limit, p, burst, cost, f
    alg, limit, p, burst, cost, f, pos = struct.unpack(HIT_FORMAT, blob, pos)
    if alg == FIXED_WINDOW and f < FLAG_REFUND then
      put(results, fixed_incr(key, now, limit, p, cost, burst))
    elseif alg == FIXED_WINDOW and (f == FLAG_COUNT_REJECTED or f == FLAG_COUNT_REJECTED + FLAG_ADVISORY) then
      put(results, fixed_count(key, now, limit, p, cost, burst))
    else
      apply_hit(key, now, alg, limit, p, burst, cost, f, results)
    end
  end
end

-- hit_pos is where hit i (from 1) of a decision whose hits start at pos
-- starts.
local function hit_pos(pos, i)
  return pos + HIT_BYTES * (i - 1)
end

-- decide_one decides hit i of a mode 1 or 2 decision (key is its key, its
-- hits in blob from pos on) into d (see decide_all), through the hits
-- before it: what it would write is pending in d, not written.
local function decide_one(d, key, i, now, mode, blob, pos)
  local alg, limit, p, burst, cost, f = struct.unpack(HIT_FORMAT, blob, hit_pos(pos, i))
  local advisory, refund, overdraft, countrej, lease = flags(f)
  local sk = key -- where the state is: a fixed window's is per window
  local sw = state_window(now, p, refund, lease, burst)
  if alg == FIXED_WINDOW then
    sk = win_key(key, sw)
  end
  d.sks[i] = sk
  if d.stored[sk] == nil then
    d.stored[sk] = {load(key, alg, sw)} -- {s1, s2, s3, found}
  end
  local st = d.latest[sk] or d.stored[sk]
  -- h: what the key's slices hold after this hit, if it changes
  local n1, n2, n3, ok, rem, reset, retry, exp, write, h = decide_hit(key, d.stored[sk][4], d.held_of, alg, st[1], st[2], st[3], now,
    limit, p, cost, burst, refund, overdraft, countrej, lease)
  local extra = 0
  if ok and write and lease > 0 and not refund and mode == MODE_ALL_OR_NOTHING then
    n2, rem, extra = lease_grant(n2, rem, lease)
    if extra > 0 then
      reset, retry = exp - now, n1
      h = held_grant(alg, d.held_of(key, d.stored[sk][4]), n1, extra, now)
    end
  end
  d.out[i] = {ok and 1 + extra or 0, rem, reset, retry, h and h[4] or 0}
  if write then
    d.latest[sk] = {n1, n2, n3}
    if h then
      d.held[key] = h
    end
    -- always: written under commit 1 too (overdraft, refunds, rejected
    -- count-rejected hits); held: the key's slices after it, if they
    -- change; gives_back: a give-back, which keeps the held record's TTL.
    d.writes[#d.writes + 1] = {i = i, key = key, alg = alg, n1 = n1, n2 = n2, n3 = n3, exp = exp,
      always = refund or overdraft or countrej and not ok, held = h, gives_back = lease > 0 and refund}
  end
  if not ok and not advisory and d.commit < 2 then
    if overdraft or countrej then
      d.commit = 1
    else
      d.commit = 2
    end
  end
end

-- decide_all decides every hit of a mode 1 or 2 decision in order, a key
-- that appears twice seeing its first hit through latest, and returns
-- what it found: stored (each state key's state as loaded), latest (as of
-- the pending writes), held (each key's slices, likewise), out (each
-- hit's answer), writes (pending, in order), sks (each hit's state key)
-- and commit (what may be written: 0 all, 1 only overdraft hits, refunds
-- and rejected count-rejected hits, 2 none), as limiter.Decide and
-- Commit.Writes do.
local function decide_all(keys, now, mode, k, n, blob, pos)
  local d = {stored = {}, latest = {}, held = {}, out = {}, writes = {}, sks = {}, commit = 0}
  if mode == MODE_DRY_RUN then
    d.commit = 2
  end
  -- held_of is what key's slices hold as of the pending writes; found:
  -- its counter's state exists (a new counter's slices start from none,
  -- whatever KEY|h says).
  d.held_of = function(key, found)
    if d.held[key] == nil then
      if found then
        d.held[key] = load_held(key)
      else
        d.held[key] = {0, 0, 0, 0}
      end
    end
    return d.held[key]
  end
  for i = 1, n do
    decide_one(d, keys[k + i], i, now, mode, blob, pos)
  end
  return d
end

-- write_all writes the pending writes of d that its commit allows, and
-- returns which hits were written.
local function write_all(d, now)
  local written = {}
  for _, w in ipairs(d.writes) do
    if d.commit == 0 or d.commit == 1 and w.always then
      local st = d.stored[d.sks[w.i]]
      store(w.key, w.alg, st[4], st[1], st[2], w.n1, w.n2, w.n3, w.exp, now)
      local h = w.held
      if h then
        local hexp = w.exp
        if w.gives_back then
          hexp = nil
        end
        store_held(w.key, h[1], h[2], h[3], h[4], hexp, now)
      end
      written[w.i] = true
    end
  end
  return written
end

-- apply_all runs one decision in mode 1 or 2: nothing is written until
-- every hit is decided (decide_all), then what the commit allows is
-- (write_all); a hit not counted reports what a cost of 0 sees, with its
-- own decision (and retry), and no slice.
local function apply_all(keys, now, mode, k, n, blob, pos, results)
  local d = decide_all(keys, now, mode, k, n, blob, pos)
  local written = write_all(d, now)
  local out = d.out
  for _, w in ipairs(d.writes) do
    local i = w.i
    if not written[i] then
      local alg, limit, p, burst = struct.unpack(HIT_FORMAT, blob, hit_pos(pos, i))
      local st = d.stored[d.sks[i]]
      local _, _, _, _, rem, reset = step(alg, st[1], st[2], st[3], now, limit, p, 0, burst, false, false)
      local retry = out[i][4]
      if out[i][1] > 0 then
        retry = 0
      end
      out[i] = {math.min(out[i][1], 1), rem, reset, retry, 0}
    end
  end
  for i = 1, n do
    local o = out[i]
    put(results, o[1], o[2], o[3], o[4])
    if o[1] > 1 then
      put_grant(results, o[5]) -- a grant's generation
    end
  end
end

-- batch runs a call: keys and args are its KEYS and ARGV. It is the
-- function Redis calls (FCALL), or what the script form returns (see
-- scripts.go). Each argument holds one or more decisions back to back (a
-- batch sends them all in one: one string for Redis to read and Lua to
-- make, not one per decision). A function's library outlives its calls,
-- so the per-call caches start empty here.
local function batch(keys, args)
  int_strs = {}
  local redis_now
  local results = {n = 0}
  local k = 0
  for a = 1, #args do
    local blob = args[a]
    local pos, size = 1, #blob
    while pos <= size do
      local now, mode, n, jitter, calb
      cal_blob, cal_base = blob, pos
      now, mode, n, jitter, calb, pos = struct.unpack(HEADER_FORMAT, blob, pos)
      if redis_now == nil then
        local t = redis.call('TIME')
        redis_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      if now == REDIS_TIME then
        now = redis_now
      end
      ttl_now = math.min(now, redis_now)
      ttl_jitter = jitter
      if mode == MODE_EACH then
        apply_each(keys, now, k, n, blob, pos, results)
      else
        apply_all(keys, now, mode, k, n, blob, pos, results)
      end
      pos = hit_pos(pos, n + 1) + calb
      k = k + n
    end
  end
  return pack_results(results)
end
