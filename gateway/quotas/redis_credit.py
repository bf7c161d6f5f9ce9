"""Credit in Redis: a replica takes a second's worth of admissions for a busy key in one call.

``GRANT`` counts, for every scope of a key (the key, its tenant), ``n`` requests and ``tokens``
tokens in this second's window counters, ``tokens`` and ``micros`` in the budget bucket, and new
concurrency slots (members ``<prefix><i>`` of the scope's ``:cc`` set, renewed like tickets), with
the same window reading as ``RESERVE``; each is what was asked, cut to at most a sixteenth of every
limit it counts against and to what is left under it (neither requests nor slots: nothing). The credit counts in
Redis as used before any of it is, so replicas together never admit past a limit, and the credit
one replica has not used keeps the others from at most a sixteenth of it, for at most a second.

``GIVE_BACK`` takes back what a replica did not use and corrects what it used: the requests and
tokens left of a second's credit (``r<s>``/``t<s>`` and the window's totals, while the second is
in the window), the token corrections of the requests settled (to the second each was admitted
in), the budget's tokens and micro-dollars, and the concurrency slots the replica lets go.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from gateway.contracts import QuotaState
from gateway.quotas.limits import WINDOW_SECONDS, Scope, period_id
from gateway.quotas.redis_client import Arg
from gateway.quotas.redis_scripts import MONEY, WINDOWS
from gateway.quotas.redis_store import RedisStore, _limit, _state
from gateway.quotas.store import PICOS_PER_MICRO

PAD = "#" * 64  # a pool slot's member is padded as a ticket's is (redis_store.py: the set stays a skiplist)

GRANT = WINDOWS + """
-- Arguments: now, the pool's member prefix, tokens, micros, the slots' lease end, the window,
-- this second and its two counters' field names, the TTLs of a window and of a tickets' key; per
-- scope its six limits as RESERVE takes them; then the requests wanted, and the first and the end
-- (exclusive) of the numbers of the slots wanted. Returns, after RESERVE's ten values, the
-- requests, tokens, micro-dollars and slots granted.
local prefix = ARGV[2]
local tokens, micros = tonumber(ARGV[3]), tonumber(ARGV[4])
local base = 11 + nscopes * 6
local n = tonumber(ARGV[base + 1])
local first_slot = tonumber(ARGV[base + 2])
local grow = tonumber(ARGV[base + 3]) - first_slot
local pool = tonumber(ARGV[base + 4])  -- slots the replica holds already
local pad = string.rep('#', 64)
local req, tok = {-1, -1, -1}, {-1, -1, -1}
-- what a grant may take of one limit: what is wanted, at most a sixteenth of the limit, and no
-- more than is left of it
local function most(used, want, limit) return math.max(0, math.min(want, math.floor(limit / 16), limit - used)) end

local windows, held = {}, {}
for i = 1, nscopes do
  local k = (i - 1) * 3
  local a = 11 + (i - 1) * 6
  local rpm, tpm, conc, tbudget, mbudget = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local rq_used, tk_used, lo, rnow, tnow = window(KEYS[k + 1])
  windows[i] = {rq_used, tk_used, lo, rnow, tnow}
  local reset = math.floor(((lo or sec) + win - now) * 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 2], '-inf', ARGV[1])
  if rpm ~= '-1' then
    rpm = tonumber(rpm)
    n = most(rq_used, n, rpm)
    req = tighter(req, rpm, rpm - rq_used, reset)
  end
  if tpm ~= '-1' then
    tpm = tonumber(tpm)
    tokens = most(tk_used, tokens, tpm)
    tok = tighter(tok, tpm, tpm - tk_used, reset)
  end
  held[i] = redis.call('ZCARD', KEYS[k + 2])
  if conc ~= '-1' then  -- the pool, the slots held already included, counts as one limit
    conc = tonumber(conc)
    grow = math.max(0, math.min(grow, math.floor(conc / 16) - pool, conc - held[i]))
  end
  if tbudget ~= '-1' or mbudget ~= '-1' then
    local spent = redis.call('HMGET', KEYS[k + 3], 'tokens', 'micros', 'picos')
    if not (spent[1] or spent[2]) then return {0, 'unseeded'} end
    if tbudget ~= '-1' then tokens = most(tonumber(spent[1]) or 0, tokens, tonumber(tbudget)) end
    if mbudget ~= '-1' then  -- a fraction of a micro-dollar spent counts as a whole one
      local used = (tonumber(spent[2]) or 0) + ((tonumber(spent[3]) or 0) > 0 and 1 or 0)
      micros = most(used, micros, tonumber(mbudget))
    end
  end
end
if n < 1 and grow < 1 then return {0, 'requests'} end  -- (a grant of slots alone asks no requests)
if tokens < 1 and tonumber(ARGV[3]) > 0 then return {0, 'tokens'} end
if micros < 1 and tonumber(ARGV[4]) > 0 then return {0, 'cost_budget'} end

local members = {}
for j = first_slot, first_slot + grow - 1 do
  members[#members + 1] = ARGV[5]
  members[#members + 1] = prefix .. j .. pad
end
for i = 1, nscopes do
  count(i, windows[i], n, tokens, micros)
  if grow > 0 then
    redis.call('ZADD', KEYS[(i - 1) * 3 + 2], unpack(members))
    redis.call('EXPIRE', KEYS[(i - 1) * 3 + 2], ARGV[11])
  end
end
return {1, '', -1, 0, req[1], req[2], req[3], tok[1], tok[2], tok[3], n, tokens, micros, grow}
"""

GIVE_BACK = MONEY + """
-- Arguments: the pool's member prefix, the budget's corrections of tokens, micro-dollars and
-- pico-dollars (as SETTLE takes them), the number of slots let go and their numbers, then triples
-- (second, requests, tokens) added to the window.
local prefix, dt, dm, dp = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local nslots = tonumber(ARGV[5])
local pad = string.rep('#', 64)
for k = 1, #KEYS, 3 do
  for j = 6, 5 + nslots do redis.call('ZREM', KEYS[k + 1], prefix .. ARGV[j] .. pad) end
  for j = 6 + nslots, #ARGV, 3 do
    local rf, tf = 'r' .. ARGV[j], 't' .. ARGV[j]
    local rd, td = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
    -- a second gone from the window (or a Redis that lost it) stays gone
    local m = redis.call('HMGET', KEYS[k], rf, tf, 'rs', 'ts')
    local sets = {}
    if m[1] and rd ~= 0 then
      sets[#sets + 1] = rf; sets[#sets + 1] = tonumber(m[1]) + rd
      sets[#sets + 1] = 'rs'; sets[#sets + 1] = (tonumber(m[3]) or 0) + rd
    end
    if m[2] and td ~= 0 then
      sets[#sets + 1] = tf; sets[#sets + 1] = tonumber(m[2]) + td
      sets[#sets + 1] = 'ts'; sets[#sets + 1] = (tonumber(m[4]) or 0) + td
    end
    if #sets > 0 then redis.call('HSET', KEYS[k], unpack(sets)) end
  end
  if (dt ~= '0' or dm ~= '0' or dp ~= '0') and redis.call('EXISTS', KEYS[k + 2]) == 1 then
    if dt ~= '0' then redis.call('HINCRBY', KEYS[k + 2], 'tokens', dt) end
    add_money(KEYS[k + 2], dm, dp)
  end
end
return 1
"""


@dataclass(frozen=True)
class Grant:
    """A store's answer to a request for credit: the limits' states before it (for the headers)."""

    granted: bool
    reason: str = ""
    requests: QuotaState | None = None
    tokens: QuotaState | None = None
    credit: tuple[int, int, int, int] = (0, 0, 0, 0)  # requests, tokens, micro-dollars and slots granted


@dataclass(frozen=True)
class GiveBack:
    """What a replica hands back for one key: the window's (second, requests, tokens) changes, the
    budget's corrections and the pool slots it lets go."""

    window: list[tuple[int, int, int]]
    budget_tokens: int
    budget_picos: int
    slots: list[int]


class RedisCredit:
    """The credit scripts, on a ``RedisStore``'s client and keys."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._grant = store.redis.register_script(GRANT)
        self._give_back = store.redis.register_script(GIVE_BACK)

    def _keys(self, scopes: list[Scope], now: float) -> list[str]:
        keys: list[str] = []
        for scope in scopes:
            base = self.store._base(scope.kind, scope.id)
            keys += [base + ":win", base + ":cc", f"{base}:bd:{period_id(scope.limits.budget_period, now)[0]}"]
        return keys

    async def grant(self, scopes: list[Scope], now: float, requests: int, tokens: int, micros: int, prefix: str,
                    slots: range, pool: int, lease_seconds: float) -> Grant:
        """Count up to ``requests``, ``tokens`` and ``micros`` in second ``floor(now)``, and add up
        to the pool slots ``slots`` (to the ``pool`` held), for every scope; or nothing."""
        sec = math.floor(now)
        args: list[Arg] = [now, prefix, tokens, micros, now + lease_seconds, WINDOW_SECONDS, sec, f"r{sec}", f"t{sec}",
                           2 * WINDOW_SECONDS, math.ceil(lease_seconds) + 1]
        for scope in scopes:
            lim = scope.limits
            ttl = period_id(lim.budget_period, now)[1]
            cost = -1 if lim.cost_budget is None else round(lim.cost_budget * 1e6)
            args += [_limit(lim.requests_per_minute), _limit(lim.tokens_per_minute), _limit(lim.max_concurrency),
                     _limit(lim.token_budget), cost, ttl + 86400 if ttl > 0 else 0]
        args += [requests, slots.start, slots.stop, pool]
        out = await self._grant(keys=self._keys(scopes, now), args=args)
        assert isinstance(out, list)
        if not int(out[0]):
            return Grant(False, out[1].decode() if isinstance(out[1], bytes) else str(out[1]))
        return Grant(True, "", _state(int(out[4]), int(out[5]), int(out[6])),
                     _state(int(out[7]), int(out[8]), int(out[9])), (int(out[10]), int(out[11]), int(out[12]),
                                                                      int(out[13])))

    def give_back(self, scopes: list[Scope], now: float, prefix: str, back: GiveBack) -> asyncio.Future[object]:
        """Send ``back`` without waiting; the future holds Redis's acknowledgement."""
        args: list[Arg] = [prefix, back.budget_tokens, *divmod(back.budget_picos, PICOS_PER_MICRO), len(back.slots),
                           *back.slots]
        for change in back.window:
            args += change
        return self._give_back.submit(keys=self._keys(scopes, now), args=args)

    async def renew(self, scopes: list[Scope], now: float, prefix: str, slots: list[int],
                    lease_seconds: float) -> None:
        """Extend the pool's slots like the tickets' leases (``RedisStore.renew``'s script)."""
        keys: list[str] = []
        args: list[Arg] = [now + lease_seconds, math.ceil(lease_seconds)]
        for scope in scopes:
            cc = self.store._base(scope.kind, scope.id) + ":cc"
            for slot in slots:
                keys.append(cc)
                args.append(f"{prefix}{slot}{PAD}")
        if keys:
            await self.store._renew(keys=keys, args=args)
