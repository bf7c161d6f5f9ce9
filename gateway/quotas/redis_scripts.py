"""The Lua scripts of the Redis quota store (``redis_store.py``): one per operation (one round trip,
atomic across replicas).

The scripts mirror ``MemoryStore`` exactly. Per scope there are three keys:
``<prefix>:<kind>:<id>:win`` (the 60 s sliding windows of requests and of tokens, both in one hash:
``r<second>`` and ``t<second>`` -> count, ``rs`` and ``ts``, the totals of the seconds held, and
``lo``, the oldest second held, the same for both: every admission adds to both), ``:cc`` (sorted
set of in-flight tickets scored by lease end, renewed by the heartbeat, which adds a ticket the
set dropped back: see ``store.py``) and ``:bd:<period>`` (hash with ``tokens`` and the money spent
plus reserved in the budget period: ``micros``, whole micro-dollars, and ``picos``, the
pico-dollars past them, 0 to 999,999; a scope with a budget
whose bucket is missing is refused as ``unseeded`` until it is rebuilt: ``SEED`` starts it at the
usage records' figures plus the reservations of the tickets in flight, which no record holds yet,
and notes the second it did so in ``seeded``: ``SETTLE`` tells by it a ticket whose lease expired,
still counted in the bucket, from one reserved before Redis lost its state). A charge made once
notes its key in ``<prefix>:charged:<once>`` for ``ONCE_SECONDS``, in the same ``SETTLE``, which does
nothing when the key is there. ``SEED`` notes in the bucket it writes, as a field ``c:<once>``, the
once-keys of the charges to come that the usage records it was given hold (``store.py``), unless
``<prefix>:charged:<once>`` is there (charged already); ``SETTLE`` under that key deletes the field
and adds nothing to that bucket. (``SETTLE`` took no once-key before 2026-12, nor did ``SEED`` note
any: in a rolling update a replica of the older version runs its own scripts, and its charges, sent
without a key or not reading the notes, are counted as before; a bucket it rebuilt has no notes.)

(Until 2026-12 a bucket counted whole micro-dollars alone, each settlement rounded: ``micros``
keeps that meaning, so in a rolling update a replica of the older version reads the newer ones'
spend to the micro-dollar and the newer ones read its own, both in the same bucket.)

A window is read in constant time: one HMGET of the totals, ``lo`` and this second's counters
answers it, and one HSET writes an admission (the script runs alone, so values read and written
back stand for increments); only when a second has left the window are the seconds that left
read, subtracted and deleted (and the oldest one left found). A full scan of the hash is the
fallback for a clock far from the one that wrote the window. (Until 2026-12 each window had a key
of its own, ``:rqw`` and ``:tkw``, and counters were added one HINCRBY at a time: twice the calls.
A rolling update across that change counts the windows of old and new replicas apart for up to
a minute; concurrency and budgets are unaffected.)

Each key's TTL is refreshed by its scope's first admission of a second (the window's counter for
that second is new), not by every admission; a settlement skips corrections of zero.

A ticket's member in ``:cc`` is its id and reservation, padded past 64 bytes
(``zset-max-listpack-value``): Redis then keeps the set as a skiplist and a dict, where ZADD and
ZREM cost about a microsecond, instead of a listpack, where each ZADD scans every ticket in flight
(some 14 µs at 64 in flight, 25 µs at 127). For the same reason the window's ``lo`` field is
named ``lo`` padded past 64 bytes (``hash-max-listpack-value``): the window, some 120 fields when
full, stays a hash table, where a field is found in constant time, not a listpack scanned for each
field an HMGET or HSET names (about 1 µs a call instead of 0.25). Only speed depends on either: a
Redis configured otherwise counts the same.
"""

from __future__ import annotations

MONEY = """
-- Add dm micro-dollars and dp pico-dollars (0 <= dp < 1e6, both strings) to budget bucket `key`:
-- `picos` stays under a micro-dollar, carrying into `micros`.
local function add_money(key, dm, dp)
  if dp ~= '0' and redis.call('HINCRBY', key, 'picos', dp) >= 1000000 then
    redis.call('HINCRBY', key, 'picos', -1000000)
    redis.call('HINCRBY', key, 'micros', 1)
  end
  if dm ~= '0' then redis.call('HINCRBY', key, 'micros', dm) end
end
"""

WINDOWS = """
-- Shared by RESERVE and GRANT (redis_credit.py): ARGV[1] is now, ARGV[6] the window, ARGV[7] this
-- second and ARGV[8], ARGV[9] its two counters' field names.
local now = tonumber(ARGV[1])
local win = tonumber(ARGV[6])
local sec = tonumber(ARGV[7])
local rsec, tsec = ARGV[8], ARGV[9]
local nscopes = #KEYS / 3
local lo_field = 'lo' .. string.rep('#', 64)  -- past 64 bytes: the hash stays a hash table (see above)

-- A window after a full scan: (requests used, tokens used, oldest second held or nil); the seconds
-- that left it are deleted and the totals written.
local function rescan(key)
  local data = redis.call('HGETALL', key)
  local rq, tk, oldest, stale = 0, 0, nil, {}
  for i = 1, #data, 2 do
    local s = tonumber(string.sub(data[i], 2))
    if s ~= nil then  -- r<second> or t<second>, not 'rs', 'ts' or lo_field
      if s <= sec - win then
        stale[#stale + 1] = data[i]
      else
        if string.byte(data[i]) == 114 then rq = rq + tonumber(data[i + 1]) else tk = tk + tonumber(data[i + 1]) end
        if oldest == nil or s < oldest then oldest = s end
      end
    end
  end
  if oldest == nil then
    redis.call('DEL', key)
    return 0, 0, nil
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  redis.call('HSET', key, 'rs', rq, 'ts', tk, lo_field, oldest)
  return rq, tk, oldest
end

-- A window: (requests used, tokens used, oldest second held or nil, this second's requests and
-- tokens or nil); the seconds that left it are deleted (and the totals that lost them written).
local function window(key)
  local m = redis.call('HMGET', key, 'rs', 'ts', lo_field, rsec, tsec)
  local rq, tk, lo, rnow, tnow = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), tonumber(m[4]), tonumber(m[5])
  if lo == nil then return 0, 0, nil, rnow, tnow end
  local cutoff = sec - win
  if lo > cutoff then return rq, tk, lo, rnow, tnow end
  if cutoff - lo > 4 * win then
    rq, tk, lo = rescan(key)
    return rq, tk, lo, rnow, tnow
  end
  local names = {}
  for s = lo, cutoff do
    names[#names + 1] = 'r' .. s
    names[#names + 1] = 't' .. s
  end
  local left = redis.call('HMGET', key, unpack(names))
  for i = 1, #left, 2 do
    if left[i] then rq = rq - tonumber(left[i]) end
    if left[i + 1] then tk = tk - tonumber(left[i + 1]) end
  end
  redis.call('HDEL', key, unpack(names))
  names = {}
  for s = cutoff + 1, sec do names[#names + 1] = 'r' .. s end
  local held = redis.call('HMGET', key, unpack(names))
  for i = 1, #held do
    if held[i] then
      redis.call('HSET', key, 'rs', rq, 'ts', tk, lo_field, cutoff + i)
      return rq, tk, cutoff + i, rnow, tnow
    end
  end
  -- nothing held up to now: the window is empty, or holds only seconds ahead of this clock
  rq, tk, lo = rescan(key)
  return rq, tk, lo, rnow, tnow
end

-- A limit's state for the headers: the most restrictive of the scopes' {limit, remaining, reset}.
local function tighter(state, limit, remaining, reset)
  if remaining < 0 then remaining = 0 end
  if state[1] == -1 or remaining < state[2] then return {limit, remaining, reset} end
  return state
end

-- Count n requests and `tokens` tokens in scope i's window ``w`` (as window() read it) for this
-- second; ARGV[10] is a window's TTL. The scope's first admission of this second (the window's
-- counters for it are new) refreshes the window's TTL (a TTL a second older than the last write
-- still outlives the window); whether it was is returned.
local function count_window(i, w, n, tokens)
  local key = KEYS[(i - 1) * 3 + 1]
  local first = w[4] == nil
  local rnext, tnext = (w[4] or 0) + n, (w[5] or 0) + tokens
  if w[3] == nil or sec < w[3] then
    redis.call('HSET', key, rsec, rnext, tsec, tnext, 'rs', w[1] + n, 'ts', w[2] + tokens, lo_field, sec)
  else
    redis.call('HSET', key, rsec, rnext, tsec, tnext, 'rs', w[1] + n, 'ts', w[2] + tokens)
  end
  if first then redis.call('EXPIRE', key, ARGV[10]) end
  return first
end

-- count_window(), and as many tokens and `micros` micro-dollars in scope i's budget.
-- A scope without a budget keeps up a bucket that exists (a budget removed in this period) but
-- never makes one: it would hold only what was spent since this Redis lost its state, and a budget
-- set later in the period would trust it instead of rebuilding it from the usage records.
-- The scope's first admission of this second refreshes its budget's TTL too; whether it was is
-- returned, for the caller to refresh its tickets' key's too.
local function count(i, w, n, tokens, micros)
  local k = (i - 1) * 3
  local a = 11 + (i - 1) * 6
  local budget_ttl = ARGV[a + 6]
  local first = count_window(i, w, n, tokens)
  if ARGV[a + 4] ~= '-1' or ARGV[a + 5] ~= '-1' or redis.call('EXISTS', KEYS[k + 3]) == 1 then
    redis.call('HINCRBY', KEYS[k + 3], 'tokens', tokens)
    redis.call('HINCRBY', KEYS[k + 3], 'micros', micros)
    if first and budget_ttl ~= '0' then redis.call('EXPIRE', KEYS[k + 3], budget_ttl) end
  end
  return first
end
"""

RESERVE = WINDOWS + """
-- Arguments: now, the ticket's member (empty: a poll, which holds no ticket: checked against
-- requests/min alone and counted there, as a request of no tokens; see store.py), tokens, micros,
-- its lease's end, the window, this second and its two counters' field names, the TTLs of a window
-- and of a tickets' key; then per scope its requests/min, tokens/min, concurrency, token and
-- micro-dollar budgets (-1: none) and the TTL of its budget bucket (0: none). What goes to Redis
-- unchanged (scores, increments, TTLs) stays the string it came as: a number turned back into a
-- command's argument costs a third of the call.
local ticket = ARGV[2]
local poll = ticket == ''
local tokens = tonumber(ARGV[3])
local micros = tonumber(ARGV[4])
local req = {-1, -1, -1}
local tok = {-1, -1, -1}
local windows, held = {}, {}
-- A refusal at scope i, whatever its reason, with the tightest requests/min and tokens/min of every
-- scope as they stand (nothing reserved) for its headers: the windows of scopes 1..i were read by the
-- loop below, those after i are read here (only a refusal pays for them).
local function reject(reason, i, retry_ms)
  local rq, tk = {-1, -1, -1}, {-1, -1, -1}
  for j = 1, nscopes do
    local a = 11 + (j - 1) * 6
    local rpm, tpm = ARGV[a + 1], ARGV[a + 2]
    if rpm ~= '-1' or tpm ~= '-1' then
      local w = windows[j] or {window(KEYS[(j - 1) * 3 + 1])}
      local reset = math.floor(((w[3] or sec) + win - now) * 1000)
      if rpm ~= '-1' then rq = tighter(rq, tonumber(rpm), tonumber(rpm) - w[1], reset) end
      if tpm ~= '-1' then tk = tighter(tk, tonumber(tpm), tonumber(tpm) - w[2], reset) end
    end
  end
  return {0, reason, i - 1, retry_ms, rq[1], rq[2], rq[3], tk[1], tk[2], tk[3]}
end

-- Milliseconds until the seconds leaving window `key` free `need` of its counters `kind` ('r' or
-- 't'), from its `oldest` second on: a retry then finds room (not merely when the oldest second
-- leaves, which frees too little after a limit was lowered, or for a large request); the newest
-- second held when none does.
local function room_in(key, kind, oldest, need)
  local room_at = oldest
  for s = oldest, sec do
    local n = redis.call('HGET', key, kind .. s)
    if n then
      room_at, need = s, need - tonumber(n)
      if need <= 0 then break end
    end
  end
  return math.floor((room_at + win - now) * 1000)
end

for i = 1, nscopes do
  local k = (i - 1) * 3
  local a = 11 + (i - 1) * 6
  local rpm, tpm, conc = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local tbudget, mbudget = ARGV[a + 4], ARGV[a + 5]
  local rq_used, tk_used, lo, rnow, tnow = window(KEYS[k + 1])
  windows[i] = {rq_used, tk_used, lo, rnow, tnow}
  local oldest = lo or sec
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 2], '-inf', ARGV[1])
  if rpm ~= '-1' then
    rpm = tonumber(rpm)
    local reset = math.floor((oldest + win - now) * 1000)
    if rq_used + 1 > rpm then
      return reject('requests', i, room_in(KEYS[k + 1], 'r', oldest, rq_used + 1 - rpm))
    end
    req = tighter(req, rpm, rpm - rq_used - 1, reset)
  end
  if tpm ~= '-1' then
    tpm = tonumber(tpm)
    local reset = math.floor((oldest + win - now) * 1000)
    if tk_used + tokens > tpm and not poll then
      return reject('tokens', i, room_in(KEYS[k + 1], 't', oldest, tk_used + tokens - tpm))
    end
    tok = tighter(tok, tpm, tpm - tk_used - tokens, reset)
  end
  if not poll then held[i] = redis.call('ZCARD', KEYS[k + 2]) end
  if conc ~= '-1' and not poll and held[i] + 1 > tonumber(conc) then
    return reject('concurrency', i, 1000)
  end
  if (tbudget ~= '-1' or mbudget ~= '-1') and not poll then
    local spent = redis.call('HMGET', KEYS[k + 3], 'tokens', 'micros', 'picos')
    if not (spent[1] or spent[2]) then return reject('unseeded', i, 0) end
    if tbudget ~= '-1' and (tonumber(spent[1]) or 0) + tokens > tonumber(tbudget) then
      return reject('token_budget', i, -1)
    end
    if mbudget ~= '-1' then
      local m, b = (tonumber(spent[2]) or 0) + micros, tonumber(mbudget)
      if m > b or (m == b and (tonumber(spent[3]) or 0) > 0) then return reject('cost_budget', i, -1) end
    end
  end
end

for i = 1, nscopes do
  local k = (i - 1) * 3
  -- The tickets' key's TTL is refreshed with the window's: it then outlives every lease given out
  -- in this second (each ends before now + 1 + lease; the heartbeat's renewals extend it from
  -- there). A tickets' key this ZADD creates gets one too.
  if poll then
    count_window(i, windows[i], 1, 0)
  else
    local first = count(i, windows[i], 1, tokens, micros)
    redis.call('ZADD', KEYS[k + 2], ARGV[5], ticket)
    if first or held[i] == 0 then redis.call('EXPIRE', KEYS[k + 2], ARGV[11]) end
  end
end
return {1, '', -1, 0, req[1], req[2], req[3], tok[1], tok[2], tok[3]}
"""

SETTLE = MONEY + """
-- Keys: per scope its window, tickets and budget bucket; then, for a charge made once, its once-key.
-- Arguments: the ticket's member, the token counter of the second it was reserved in, the
-- corrections of tokens, micro-dollars and pico-dollars, the actual figures (the same three:
-- integers, as strings), the second it was reserved in (-1: a reservation given back, which
-- may never have been made), and, for a charge made once, the once-key's TTL and the once-key's
-- name as SEED notes it. A once-key that exists: charged before, nothing is done (0 is returned);
-- a bucket rebuilt holding the charge (its note, deleted here) is not charged.
local ticket, tsec, second = ARGV[1], ARGV[2], tonumber(ARGV[9])
local nkeys = #KEYS - #KEYS % 3
local once = nkeys < #KEYS
if once and not redis.call('SET', KEYS[#KEYS], 1, 'NX', 'EX', ARGV[10]) then return 0 end
for k = 1, nkeys, 3 do
  -- a ticket this Redis does not hold was reserved before it lost its state (its budget bucket was
  -- rebuilt after it), or never: add the actual figures; one whose lease expired (its replica could
  -- not renew it) in a bucket older than it is still counted there: correct it
  local known = redis.call('ZREM', KEYS[k + 1], ticket) == 1
  if not known and second >= 0 then
    local seeded = tonumber(redis.call('HGET', KEYS[k + 2], 'seeded'))
    known = seeded ~= nil and seeded <= second
  end
  local dt, dm, dp = ARGV[3], ARGV[4], ARGV[5]
  if not known then dt, dm, dp = ARGV[6], ARGV[7], ARGV[8] end
  -- (a correction of zero changes nothing: no call is made for it; a second gone from the window stays gone)
  if dt ~= '0' then
    local m = redis.call('HMGET', KEYS[k], tsec, 'ts')
    if m[1] then
      local n = tonumber(dt)
      redis.call('HSET', KEYS[k], tsec, tonumber(m[1]) + n, 'ts', (tonumber(m[2]) or 0) + n)
    end
  end
  local counted = once and redis.call('HDEL', KEYS[k + 2], 'c:' .. ARGV[11]) == 1
  if (dt ~= '0' or dm ~= '0' or dp ~= '0') and not counted and redis.call('EXISTS', KEYS[k + 2]) == 1 then
    if dt ~= '0' then redis.call('HINCRBY', KEYS[k + 2], 'tokens', dt) end
    add_money(KEYS[k + 2], dm, dp)
  end
end
return 1
"""

RENEW = """
-- A pool's slots (redis_credit.py). Arguments: the slots' new end, the TTL of a tickets' key, then
-- the slots' members. A slot the set dropped (it expired while its replica could not renew it) is
-- added back: the replica still holds it.
for i = 1, #KEYS do
  if redis.call('ZADD', KEYS[i], 'CH', ARGV[1], ARGV[i + 2]) == 1 then redis.call('EXPIRE', KEYS[i], ARGV[2]) end
end
return 1
"""

RENEW_TICKETS = """
-- Keys: per lease and scope, its tickets' key and its budget bucket. Arguments: the leases' new
-- end, the TTL of a tickets' key, then the tickets' members (one per pair of keys).
for i = 1, #KEYS, 2 do
  local ticket = ARGV[(i + 1) / 2 + 2]
  if redis.call('ZADD', KEYS[i], 'XX', 'CH', ARGV[1], ticket) == 1 then
    redis.call('EXPIRE', KEYS[i], ARGV[2])
  elseif not redis.call('ZSCORE', KEYS[i], ticket) then
    -- dropped while its request runs: held again, over the limit if its slot was taken meanwhile
    -- (store.py); a bucket rebuilt after its admission did not count it: its reservation is added
    redis.call('ZADD', KEYS[i], ARGV[1], ticket)
    redis.call('EXPIRE', KEYS[i], ARGV[2])
    local s, t, m = string.match(ticket, '^[^:]+:(%d+):(%d+):(%d+)#')
    local seeded = tonumber(redis.call('HGET', KEYS[i + 1], 'seeded'))
    if s and seeded ~= nil and seeded > tonumber(s) then
      redis.call('HINCRBY', KEYS[i + 1], 'tokens', t)
      redis.call('HINCRBY', KEYS[i + 1], 'micros', m)
    end
  end
end
return 1
"""

SEED = """
-- Keys: the budget bucket, the scope's tickets, then the once-keys of the charges to come that the
-- usage records hold (store.py). Arguments: the tokens, whole micro-dollars and the pico-dollars
-- past them the usage records show, the period's TTL, now, the second the period began (-1: the
-- "total" period), then those once-keys' names.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local tokens, micros, since = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[6])
-- The tickets in flight that were reserved in this period (while the scope had no bucket) are in
-- no usage record yet, and their settlements will correct their reservations: the bucket starts
-- with those. Leases that ended are dropped first, as RESERVE drops them (their settlements add
-- the actual figures); a pool's slots (redis_credit.py) hold no reservation of their own.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local s, t, mi = string.match(m, '^[^:]+:(%d+):(%d+):(%d+)#')
  if s and tonumber(s) >= since then tokens, micros = tokens + tonumber(t), micros + tonumber(mi) end
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'micros', micros, 'picos', ARGV[3],
           'seeded', math.floor(tonumber(ARGV[5])))
-- a charge to come that the records hold adds nothing here (its note); one that ran needs none
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then redis.call('HSET', KEYS[1], 'c:' .. ARGV[i + 4], 1) end
end
if tonumber(ARGV[4]) > 0 then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]) + 86400) end
return 1
"""

FORGET = """
-- Keys: budget buckets, then tickets' keys. Arguments: the number of buckets, then one member per
-- tickets' key. The buckets are deleted (rebuilt from the usage records at the next admission),
-- the members dropped (stale.py).
local n = tonumber(ARGV[1])
for i = 1, n do redis.call('DEL', KEYS[i]) end
for i = n + 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[i - n + 1]) end
return 1
"""
