-- state: what batch.lua (appended after the algorithm files, this and
-- lease.lua) reads and steps of a key: numbers formatted once per call,
-- TTLs, a window's state, the step of each algorithm, a hit's flags.

-- int_str is integer n in decimal: a cost, a TTL, or the window number
-- in a fixed window's key (win_key). redis.call turns a number argument
-- into a string with snprintf, which costs more than the command it
-- passes it to; a batch's hits share one clock and mostly a few costs, so
-- each is formatted once per call.
local int_strs
local function int_str(n)
  local s = int_strs[n]
  if s == nil then
    s = string.format('%d', n)
    int_strs[n] = s
  end
  return s
end

-- ttl_now is the instant TTLs are measured from: a call's now, or Redis's
-- TIME when a call counts at a later instant than that (a reservation
-- made ahead for a coming window), so that a key set ahead still lives
-- until its window has ended by Redis's clock. Set per call by batch.
local ttl_now = 0

-- ttl_jitter is the milliseconds added to every TTL a decision sets (its
-- header's jitter: EXPIRATION_JITTER_MAX_SECONDS spreads expiries). Set
-- per decision by batch. A key living longer changes no answer: every
-- state names its window or instant.
local ttl_jitter = 0

-- ttl_ms is the TTL, in whole milliseconds (at least 1), of a key that
-- must live until exp µs, plus the decision's jitter.
local function ttl_ms(exp)
  return math.max(1, math.ceil((exp - ttl_now) / 1000)) + ttl_jitter
end

-- win_key is the key of window w's count of a fixed window on key: its
-- own key, beside key in its hash slot (the store sends only keys with a
-- hash tag). It holds the count as an integer, and expires when its window
-- ends by Redis's clock, from its first write on (new_window here, or
-- plain.go's PEXPIREAT ... NX in the same transaction): nothing else ever
-- drops or shortens it, so every writer, the function or the plain path,
-- of any version that writes this format, meets one lifecycle.
local function win_key(key, w)
  return key .. '|' .. int_str(w)
end

-- new_window follows the first count of window w, whose key is wk, ending
-- at exp µs: the key expires with its window.
local function new_window(wk, exp)
  redis.call('PEXPIRE', wk, int_str(ttl_ms(exp)))
end

-- state_window is the window whose fixed-window state (alg 0) a hit reads:
-- now's, or for a give-back (a refund with a lease) the slice's own, so
-- that a give-back sent by a clock that has moved on still finds it. cal
-- is the hit's calendar (see window).
local function state_window(now, p, refund, lease, cal)
  if refund and lease > 0 then
    return lease - 1
  end
  return (window(now, p, cal))
end

-- load reads a key's state: three doubles (zeros when absent; a fixed
-- window's is {w, count, 0}, from window w's key, win_key), or for a
-- sliding log or concurrency its blob ("" when absent), and whether the key was
-- there.
local function load(key, alg, w)
  if alg == FIXED_WINDOW then
    local c = tonumber(redis.call('GET', win_key(key, w)) or '')
    if c then
      return w, c, 0, true
    end
    return 0, 0, 0, false
  end
  local v = redis.call('GET', key)
  if alg == SLIDING_LOG or alg == CONCURRENCY then
    if v then
      return v, 0, 0, true
    end
    return '', 0, 0, false
  end
  if v and #v == 24 then
    local a, b, c = struct.unpack('<ddd', v)
    return a, b, c, true
  end
  return 0, 0, 0, false
end

local function step(alg, s1, s2, s3, now, limit, p, cost, burst, refund, overdraft, countrej)
  if alg == SLIDING_WINDOW then
    return sliding_window(s1, s2, s3, now, limit, p, cost, refund, overdraft, burst)
  elseif alg == TOKEN_BUCKET then
    return token_bucket(s1, now, limit, p, cost, burst, refund, overdraft)
  elseif alg == SLIDING_LOG then
    return sliding_log(s1, now, limit, p, cost, refund, overdraft, false)
  elseif alg == CONCURRENCY then
    return sliding_log(s1, now, limit, p, cost, refund, overdraft, true)
  end
  return fixed_window(s1, s2, now, limit, p, cost, refund, overdraft, countrej, burst)
end

-- has says whether flags double f has flag's bit.
local function has(f, flag)
  return math.floor(f / flag) % 2 == 1
end

-- flags splits a hit's flags double: advisory, refund, overdraft,
-- count-rejected (limiter.Rule.CountRejected), lease.
local function flags(f)
  if f == 0 then
    return false, false, false, false, 0
  end
  return has(f, FLAG_ADVISORY), has(f, FLAG_REFUND), has(f, FLAG_OVERDRAFT), has(f, FLAG_COUNT_REJECTED), math.floor(f / FLAG_LEASE)
end
