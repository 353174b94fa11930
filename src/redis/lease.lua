-- lease: the Redis side of leased budgets (lease.go): a slice counted
-- beside an allowed hit, the record of slices held against refunds
-- (held hits), and a slice given back.

-- lease_grant counts a slice on top of an allowed hit of a window
-- algorithm: up to want more hits, never more than half of what remains,
-- so that replicas near the limit take smaller and smaller slices and the
-- last hits are decided here one by one. count is the window's current
-- count (the state's second double for both window algorithms); the
-- slice is part of it, so no window ever counts past its limit.
local function lease_grant(count, rem, want)
  local extra = math.min(want, math.floor(rem / 2))
  return count + extra, rem - extra, extra
end

-- lease_return gives back n unspent hits of a slice counted in window w:
-- from that window's count while it is the key's current window (s1), or
-- for a sliding window, from the previous window's count once the key has
-- moved on by one (those hits still weigh on it). Later, or on a fixed
-- window that has moved on, they expired with their window. Returns the
-- new state and whether it changed; the window number stays, so the key's
-- TTL does.
local function lease_return(alg, s1, s2, s3, w, n)
  if s1 == w and s2 > 0 then
    return s1, s2 - math.min(s2, n), s3, true
  elseif alg == SLIDING_WINDOW and s1 == w + 1 and s3 > 0 then
    return s1, s2, s3 - math.min(s3, n), true
  end
  return s1, s2, s3, false
end

-- Held hits: a window's count includes the slices granted in it
-- (lease_grant). A refund (is_negative_hits) must never lower a count below
-- what was granted as slices and not given back, or it would free budget a
-- replica still admits from (or has admitted from: the two cannot be told
-- apart here). What is held is kept beside the counter, in KEY|h (same hash
-- tag, so same slot): {w, hc, hp, g}, the window it was written in, what
-- that window's slices hold, for a sliding window what the window before
-- it held, and its generation: the instant (µs) the record was created,
-- by the first grant while no slice was held. A grant answers g, and a
-- give-back names it (see give_back): Redis restarted without persistence
-- or flushed forgets the record with the counts, and a slice granted
-- before that must not come back to the counter that replaced them. Only grants, give-backs and refunds read or write it; a counter
-- whose rule has no lease never has one, and its state is unchanged.
local function held_at(alg, w, hc, hp, s1)
  if w == s1 then
    return hc, hp
  elseif alg == SLIDING_WINDOW and s1 == w + 1 then
    return 0, hc
  end
  return 0, 0
end

-- held_key is where key's held hits are kept: beside it, in its hash
-- slot. Counter keys carry a hash tag; one without (none is written by the
-- service) keeps nothing held, since no other key is sure to share its
-- slot.
local function held_key(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then
      return key .. '|h'
    end
  end
  return nil
end

local function load_held(key)
  local hk = held_key(key)
  local v = hk and redis.call('GET', hk)
  if v and #v == 32 then
    local w, hc, hp, g = struct.unpack('<dddd', v)
    return {w, hc, hp, g}
  end
  return {0, 0, 0, 0}
end

-- store_held writes what key's slices hold as of window w; exp (µs) is when
-- the counter's state expires, or nil to keep the TTL (a give-back).
local function store_held(key, w, hc, hp, g, exp, now)
  local hk = held_key(key)
  if not hk then
    return
  elseif hc == 0 and hp == 0 then
    redis.call('DEL', hk)
  elseif exp then
    redis.call('SET', hk, struct.pack('<dddd', w, hc, hp, g), 'PX', ttl_ms(exp))
  else
    redis.call('SET', hk, struct.pack('<dddd', w, hc, hp, g), 'KEEPTTL')
  end
end

-- held_grant adds a slice of extra hits granted in window n1 to what key's
-- slices hold (h); returns the new record. With none held, it is a new
-- generation, named by now.
local function held_grant(alg, h, n1, extra, now)
  local hc, hp = held_at(alg, h[1], h[2], h[3], n1)
  local g = h[4]
  if hc == 0 and hp == 0 then
    g = now
  end
  return {n1, hc + extra, hp, g}
end

-- refund_held applies a refund to a window counter less what its slices
-- hold (h: {w, hc, hp}), adding them back after; the answer is then what a
-- cost of 0 sees.
local function refund_held(alg, s1, s2, s3, h, now, limit, p, cost, burst, overdraft)
  local hc, hp = held_at(alg, h[1], h[2], h[3], s1)
  if hc == 0 and hp == 0 or cost == 0 then
    return step(alg, s1, s2, s3, now, limit, p, cost, burst, true, overdraft)
  end
  local n1, n2, n3, ok, _, _, retry, exp, write = step(alg, s1, s2 - hc, s3 - hp, now, limit, p, cost, burst, true, overdraft)
  if n1 == s1 then
    n2, n3 = n2 + hc, n3 + hp
  elseif alg == SLIDING_WINDOW and n1 == s1 + 1 then
    n3 = n3 + hc -- the window moved on by one: its held count is now the previous one
  end
  local _, _, _, _, rem, reset = step(alg, n1, n2, n3, now, limit, p, 0, burst, false, false)
  return n1, n2, n3, ok, rem, reset, retry, exp, write
end

-- give_back takes a slice of window w back: n unspent hits, size granted
-- in all, of generation g. It frees nothing unless key's slices' record
-- (h) is of that generation, and no more than it still holds in that
-- window: a counter that lost its record with its counts (a Redis
-- restarted without persistence, a flush) never granted what comes back,
-- and freeing it would free budget counted nowhere, or held by other
-- replicas' slices. Returns the new state, whether it changed, and the
-- new record, or nil if that did not change.
local function give_back(alg, s1, s2, s3, h, w, n, size, g)
  if h[4] ~= g then
    return s1, s2, s3, false, nil
  end
  local hc, hp = held_at(alg, h[1], h[2], h[3], s1)
  local held = 0
  if s1 == w then
    held = hc
  elseif alg == SLIDING_WINDOW and s1 == w + 1 then
    held = hp
  end
  if held == 0 then
    return s1, s2, s3, false, nil
  end
  local n1, n2, n3, write = lease_return(alg, s1, s2, s3, w, math.min(n, held))
  if s1 == w then
    return n1, n2, n3, write, {s1, hc - math.min(hc, size), hp, g}
  end
  return n1, n2, n3, write, {s1, hc, hp - math.min(hp, size), g}
end

-- no_held is what a key's slices hold when its counter has no state yet
-- (found false: whatever KEY|h says), else what KEY|h holds.
local function no_held(key, found)
  if found then
    return load_held(key)
  end
  return {0, 0, 0, 0}
end

-- decide_hit steps a key's state (s1, s2, s3) for one hit: a slice given
-- back, a refund of a window algorithm (which minds the slices held
-- against refunds), or the algorithm's own step. held_of(key, found)
-- says what the key's slices hold; it is asked only for a refund. It
-- returns step's nine results, and h, what the key's slices hold after a
-- give-back that changes them.
local function decide_hit(key, found, held_of, alg, s1, s2, s3, now, limit, p, cost, burst, refund, overdraft, countrej, lease)
  if refund and lease > 0 then
    local n1, n2, n3, write, h = give_back(alg, s1, s2, s3, held_of(key, found), lease - 1, cost, burst, limit)
    return n1, n2, n3, true, 0, 0, 0, now, write, h
  elseif refund and (alg == FIXED_WINDOW or alg == SLIDING_WINDOW) then
    local n1, n2, n3, ok, rem, reset, retry, exp, write = refund_held(alg, s1, s2, s3, held_of(key, found), now, limit, p, cost,
      burst, overdraft)
    return n1, n2, n3, ok, rem, reset, retry, exp, write, nil
  end
  local n1, n2, n3, ok, rem, reset, retry, exp, write = step(alg, s1, s2, s3, now, limit, p, cost, burst, refund, overdraft, countrej)
  return n1, n2, n3, ok, rem, reset, retry, exp, write, nil
end
