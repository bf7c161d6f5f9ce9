"""The quota store seam, and the in-process store for the embedded default.

A store checks and reserves every limit of every scope in one atomic step, or reserves nothing.
``RedisStore`` (``redis_store.py``) runs the same algorithm as a Lua script; this module's
``MemoryStore`` is its reference, with identical semantics inside one process:

- requests/min and tokens/min: a sliding window of 60 one-second buckets; admit when
  ``used + this <= limit``; a refusal's retry is when enough seconds have left the window to
  admit it (after a limit was lowered, more than the oldest one);
- concurrency: leases that end at settle, or ``lease_seconds`` after the last ``renew`` (the live
  replica renews its leases on a heartbeat, so a dead replica's slots free themselves);
- budgets: tokens and money per period bucket, reserved at admit, corrected at settle. A
  reservation is a ceiling in whole micro-dollars; what a request cost is counted in pico-dollars
  (``picos``: the usage records' float dollars to 1e-12, exact for any price with up to six
  decimals per million tokens), so a budget is charged what the usage records say, however cheap
  each request (whole micro-dollars rounded a request under half of one to nothing).
  A bucket the store does not hold (a restart, a flushed Redis) is refused as ``unseeded``: the
  caller rebuilds it from the usage records (``seed_budget``) and asks again, so a store that lost
  its state never hands out a budget twice. The rebuilt bucket also holds the reservations of the
  leases in flight that were made in the period (a budget set while requests run): no usage
  record holds them yet, and their settlements correct them as for any reservation. A settle
  whose lease the store does not know adds the actual figures instead of correcting a
  reservation when the store restarted since the admission (its bucket was rebuilt after the
  lease's second), or when it gives back a reservation that may never have been made; a lease
  that merely expired (its replica could not renew it) in a bucket older than it is corrected.
  A lease dropped while its request still runs (it expired: its replica could not renew it) is
  held again by the heartbeat's next ``renew``, even where that puts the scope over its
  concurrency limit (another request took the slot meanwhile): the request is running, and a slot
  not counted would let one more in. Its reservation stays in the bucket it was counted in; a
  bucket rebuilt after its admission without it (it was gone then) gets it again, as its
  settlement corrects it (so a lease dropped after that rebuild counted it is counted twice: an
  over-count of one reservation, never an under-count).
  A scope without a budget never makes a bucket (it adds to one that exists: a budget removed in
  the period): one made by a store that lost its state would hold only the spend since, and a
  budget set later in the period would trust it instead of being rebuilt from the records.
- polls (``Reservation.requests_only``: a read or cancel of a stored response, which spends
  nothing itself): checked against requests/min alone and counted there (one request, no
  tokens); they hold no lease and touch no budget, so a scope out of tokens/min, concurrency or
  budget (its bucket lost included) can still read and cancel what it already started.
- charges made once: a settlement under a once-key (``settle(..., once=)``: the charge of a
  background response's spend) runs only if no settlement under that key ran in the last
  ``ONCE_SECONDS``; the key is noted in the same atomic step, so a charge sent again (its sender
  died not knowing whether it ran) adds nothing. A bucket rebuilt from the usage records that
  already hold such a charge's row (``seed_budget(..., counted=)``: its meterer recorded the row
  and has not charged yet) notes its once-key in it, in the same step as it is written, unless a
  charge under that key ran already: the charge, when it comes, adds nothing to that bucket (it
  still adds to the others, and to this second's tokens) and the note goes. A note lives and dies
  with its bucket: a bucket deleted (``forget``, a restart) and rebuilt again is noted again.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.contracts import QuotaState, completed
from gateway.quotas.limits import WINDOW_SECONDS, Scope, period_id

PICOS_PER_MICRO = 1_000_000
BUDGET_KEPT_SECONDS = 86400  # a budget bucket outlives its period by this much (as Redis keeps it)
SWEEP_MIN = 1024  # entries below which the memory store does not sweep
ONCE_SECONDS = 7 * 86400  # a charge's once-key is kept this long: one is sent again within a day at most


def picos(usd: float) -> int:
    """Dollars (a usage record's cost) in pico-dollars, the unit budgets count spend in."""
    return round(usd * 1e12)


@dataclass(frozen=True)
class Reservation:
    ticket_id: str
    now: float
    tokens: int
    micros: int  # money reserved, in millionths of a dollar
    scopes: list[Scope]
    lease_seconds: float = 3600.0
    requests_only: bool = False  # a poll: requests/min alone, nothing reserved (see the module's docstring)


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: str = ""  # requests | tokens | concurrency | token_budget | cost_budget | unseeded
    scope_index: int = -1
    retry_after: float = 0.0
    requests: QuotaState | None = None
    tokens: QuotaState | None = None


@dataclass(frozen=True)
class Lease:
    """What settle needs to undo or correct a reservation."""

    ticket_id: str
    second: int
    tokens: int
    micros: int
    scopes: list[tuple[str, str, str]]  # (kind, id, budget period id)


class QuotaStore(Protocol):
    async def reserve(self, r: Reservation) -> Decision: ...

    def settle(self, lease: Lease, now: float, actual_tokens: int, actual_picos: int, *,
               given_back: bool = False, once: str | None = None) -> asyncio.Future[Any]:
        """Correct the reservation (the command is on its way when this returns); the future holds
        the store's acknowledgement, or its failure. ``given_back``: the reservation may never
        have been made (its admission was cancelled). ``once``: nothing is done if a settlement
        under this key ran before (see the module's docstring)."""
        ...

    async def seed_budget(self, kind: str, sid: str, pid: str, tokens: int, picos: int, ttl: int, now: float,
                          since: float | None, *, counted: Sequence[str] = ()) -> None:
        """Start a budget bucket at the recorded spend plus the reservations of the scope's leases in
        flight made since ``since`` (the period's start; None: ever), unless the bucket exists;
        ``counted``: the once-keys of charges to come whose figures the recorded spend holds (see
        the module's docstring)."""
        ...

    async def renew(self, leases: list[Lease], now: float, lease_seconds: float) -> None:
        """Extend the concurrency leases to ``now + lease_seconds`` (the heartbeat), holding again
        those the store dropped (see the module's docstring)."""
        ...

    async def ready(self) -> bool:
        """The store answers."""
        ...

    async def forget(self, buckets: list[tuple[str, str, str]], leases: list[Lease]) -> None:
        """Delete the budget buckets (kind, id, period id), to be rebuilt from the usage records, and
        drop the leases from their scopes' tickets (``stale.py``: spend they missed in an outage)."""
        ...


def lease_for(r: Reservation) -> Lease:
    scopes = [(s.kind, s.id, period_id(s.limits.budget_period, r.now)[0]) for s in r.scopes]
    return Lease(r.ticket_id, math.floor(r.now), r.tokens, r.micros, scopes)


def budget_retry(r: Reservation, scope: Scope) -> float:
    """Seconds until the budget's period ends; 0 for the "total" period, which never ends (no wait
    restores it: admission refuses with no Retry-After)."""
    return float(period_id(scope.limits.budget_period, r.now)[1])


def tighter(current: QuotaState | None, limit: int, remaining: int, reset: float) -> QuotaState:
    """Keep the most restrictive of several scopes' states for the headers."""
    if current is None or remaining < current.remaining:
        return QuotaState(limit=limit, remaining=max(0, remaining), reset_seconds=max(0.0, reset))
    return current


def _reset(oldest: int | None, now: float) -> float:
    """Seconds until the oldest second a window holds leaves it (an empty window: this second)."""
    return (oldest if oldest is not None else math.floor(now)) + WINDOW_SECONDS - now


def _room_at(buckets: dict[int, int], need: int) -> int | None:
    """The second whose leaving the window frees ``need`` tokens, with the seconds before it; the
    newest held when none does (None: the window is empty)."""
    for second in sorted(buckets):
        need -= buckets[second]
        if need <= 0:
            return second
    return max(buckets, default=None)


@dataclass
class _Held:
    """A lease in flight: when it ends, and the reservation it holds (the second it was made in)."""

    until: float
    second: int
    tokens: int
    micros: int


@dataclass
class _Window:
    buckets: dict[int, int] = field(default_factory=dict)

    def used(self, sec: int) -> tuple[int, int | None]:
        for s in [s for s in self.buckets if s <= sec - WINDOW_SECONDS]:
            del self.buckets[s]
        return sum(self.buckets.values()), min(self.buckets, default=None)


class MemoryStore:
    """Quota state in this process (the embedded default: one gateway process, no Redis).

    A process meets millions of keys over months: a reservation a minute or more after the last
    sweep sweeps out what Redis would have let expire (windows holding nothing of the last minute,
    scopes with no lease, budget buckets a day past their period), each of which reads as it does
    absent: a sweep costs what the minute's reservations made."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._leases: dict[str, dict[str, _Held]] = {}
        self._budgets: dict[str, list[int]] = {}  # [tokens, picos]
        self._seeded: dict[str, int] = {}  # budget bucket -> the second it was rebuilt in
        self._budget_ends: dict[str, float] = {}  # budget bucket -> when it may go (none: never)
        self._once: dict[str, float] = {}  # once-key of a charge -> when it goes, oldest first
        self._counted: dict[str, set[str]] = {}  # budget bucket -> once-keys of charges to come it holds
        self._swept_at = -math.inf

    def __len__(self) -> int:
        """The entries held (windows, scopes with leases, budget buckets, charges' once-keys)."""
        return len(self._windows) + len(self._leases) + len(self._budgets) + len(self._once)

    def _sweep(self, now: float) -> None:
        sec = math.floor(now)
        self._windows = {k: w for k, w in self._windows.items() if w.used(sec)[1] is not None}
        self._leases = {k: held for k, held in self._leases.items() if held}
        for gone in [k for k, end in self._budget_ends.items() if end <= now]:
            del self._budgets[gone], self._budget_ends[gone]
            self._seeded.pop(gone, None)
            self._counted.pop(gone, None)
        self._swept_at = now

    def _window(self, key: str) -> _Window:
        return self._windows.setdefault(key, _Window())

    async def reserve(self, r: Reservation) -> Decision:
        if r.now >= self._swept_at + WINDOW_SECONDS and len(self) >= SWEEP_MIN:
            self._sweep(r.now)
        sec = math.floor(r.now)
        req_state: QuotaState | None = None
        tok_state: QuotaState | None = None
        for i, scope in enumerate(r.scopes):
            lim, base = scope.limits, f"{scope.kind}:{scope.id}"
            req_used, req_oldest = self._window(base + ":rq").used(sec)
            tok_used, tok_oldest = self._window(base + ":tk").used(sec)
            leases = self._leases.setdefault(base, {})
            for tid in [t for t, held in leases.items() if held.until <= r.now]:
                del leases[tid]
            budget = self._budgets.get(f"{base}:{period_id(lim.budget_period, r.now)[0]}")
            if budget is None:
                if (lim.token_budget is not None or lim.cost_budget is not None) and not r.requests_only:
                    return self._refuse(r, "unseeded", i, 0.0)
                budget = [0, 0]
            if lim.requests_per_minute is not None:
                reset = _reset(req_oldest, r.now)
                if req_used + 1 > lim.requests_per_minute:
                    room_at = _room_at(self._window(base + ":rq").buckets, req_used + 1 - lim.requests_per_minute)
                    return self._refuse(r, "requests", i, _reset(room_at, r.now))
                req_state = tighter(req_state, lim.requests_per_minute, lim.requests_per_minute - req_used - 1, reset)
            if lim.tokens_per_minute is not None:
                reset = _reset(tok_oldest, r.now)
                if tok_used + r.tokens > lim.tokens_per_minute and not r.requests_only:
                    room_at = _room_at(self._window(base + ":tk").buckets, tok_used + r.tokens - lim.tokens_per_minute)
                    return self._refuse(r, "tokens", i, _reset(room_at, r.now))
                left = lim.tokens_per_minute - tok_used - r.tokens
                tok_state = tighter(tok_state, lim.tokens_per_minute, left, reset)
            if r.requests_only:
                continue
            if lim.max_concurrency is not None and len(leases) + 1 > lim.max_concurrency:
                return self._refuse(r, "concurrency", i, 1.0)
            if lim.token_budget is not None and budget[0] + r.tokens > lim.token_budget:
                return self._refuse(r, "token_budget", i, budget_retry(r, scope))
            if lim.cost_budget is not None and \
                    budget[1] + r.micros * PICOS_PER_MICRO > round(lim.cost_budget * 1e6) * PICOS_PER_MICRO:
                return self._refuse(r, "cost_budget", i, budget_retry(r, scope))
        for scope in r.scopes:
            base = f"{scope.kind}:{scope.id}"
            rq, tk = self._window(base + ":rq").buckets, self._window(base + ":tk").buckets
            rq[sec] = rq.get(sec, 0) + 1
            tk[sec] = tk.get(sec, 0) + r.tokens
            if r.requests_only:
                continue
            self._leases[base][r.ticket_id] = _Held(r.now + r.lease_seconds, sec, r.tokens, r.micros)
            # a scope with a budget has its bucket (checked above); one without keeps up a bucket
            # that exists but never makes one (see the module's docstring)
            budget = self._budgets.get(f"{base}:{period_id(scope.limits.budget_period, r.now)[0]}")
            if budget is not None:
                budget[0] += r.tokens
                budget[1] += r.micros * PICOS_PER_MICRO
        return Decision(True, requests=req_state, tokens=tok_state)

    def _refuse(self, r: Reservation, reason: str, index: int, retry_after: float) -> Decision:
        """A refusal at scope ``index``, whatever its reason, with the tightest requests/min and
        tokens/min of every scope as they stand (nothing reserved) for its headers."""
        sec = math.floor(r.now)
        requests: QuotaState | None = None
        tokens: QuotaState | None = None
        for scope in r.scopes:
            base, lim = f"{scope.kind}:{scope.id}", scope.limits
            if lim.requests_per_minute is not None:
                used, oldest = self._window(base + ":rq").used(sec)
                requests = tighter(requests, lim.requests_per_minute, lim.requests_per_minute - used,
                                   _reset(oldest, r.now))
            if lim.tokens_per_minute is not None:
                used, oldest = self._window(base + ":tk").used(sec)
                tokens = tighter(tokens, lim.tokens_per_minute, lim.tokens_per_minute - used, _reset(oldest, r.now))
        return Decision(False, reason, index, retry_after, requests, tokens)

    async def seed_budget(self, kind: str, sid: str, pid: str, tokens: int, picos: int, ttl: int, now: float,
                          since: float | None, *, counted: Sequence[str] = ()) -> None:
        if f"{kind}:{sid}:{pid}" in self._budgets:
            return
        if to_come := {once for once in counted if self._once.get(once, now) <= now}:  # not charged yet
            self._counted[f"{kind}:{sid}:{pid}"] = to_come
        leases = self._leases.get(f"{kind}:{sid}", {})
        for tid in [t for t, held in leases.items() if held.until <= now]:
            del leases[tid]  # ended: its settlement adds the actual figures
        live = [h for h in leases.values() if since is None or h.second >= math.floor(since)]
        self._seeded[f"{kind}:{sid}:{pid}"] = math.floor(now)
        if ttl > 0:
            self._budget_ends[f"{kind}:{sid}:{pid}"] = now + ttl + BUDGET_KEPT_SECONDS
        self._budgets[f"{kind}:{sid}:{pid}"] = [tokens + sum(h.tokens for h in live),
                                                picos + sum(h.micros for h in live) * PICOS_PER_MICRO]

    async def renew(self, leases: list[Lease], now: float, lease_seconds: float) -> None:
        for lease in leases:
            for kind, sid, pid in lease.scopes:
                held = self._leases.setdefault(f"{kind}:{sid}", {})
                if lease.ticket_id in held:
                    held[lease.ticket_id].until = now + lease_seconds
                    continue
                held[lease.ticket_id] = _Held(now + lease_seconds, lease.second, lease.tokens, lease.micros)
                budget = self._budgets.get(f"{kind}:{sid}:{pid}")
                if budget is not None and self._seeded.get(f"{kind}:{sid}:{pid}", lease.second) > lease.second:
                    budget[0] += lease.tokens  # rebuilt without it (see the module's docstring)
                    budget[1] += lease.micros * PICOS_PER_MICRO

    async def ready(self) -> bool:
        return True

    async def forget(self, buckets: list[tuple[str, str, str]], leases: list[Lease]) -> None:
        for kind, sid, pid in buckets:
            self._budgets.pop(f"{kind}:{sid}:{pid}", None)
            self._seeded.pop(f"{kind}:{sid}:{pid}", None)
            self._counted.pop(f"{kind}:{sid}:{pid}", None)
            self._budget_ends.pop(f"{kind}:{sid}:{pid}", None)
        for lease in leases:
            for kind, sid, _ in lease.scopes:
                self._leases.get(f"{kind}:{sid}", {}).pop(lease.ticket_id, None)

    def settle(self, lease: Lease, now: float, actual_tokens: int, actual_picos: int, *,
               given_back: bool = False, once: str | None = None) -> asyncio.Future[Any]:
        if once is not None and not self._first(once, now):
            return completed()
        for kind, sid, pid in lease.scopes:
            base = f"{kind}:{sid}"
            known = self._leases.get(base, {}).pop(lease.ticket_id, None) is not None
            if not (known or given_back):  # an admitted lease that expired, in a bucket older than it
                known = self._seeded.get(f"{base}:{pid}", lease.second + 1) <= lease.second
            reserved_tokens, reserved_micros = (lease.tokens, lease.micros) if known else (0, 0)
            tk = self._windows[base + ":tk"].buckets if base + ":tk" in self._windows else {}
            if lease.second in tk:
                tk[lease.second] += actual_tokens - reserved_tokens
            budget = self._budgets.get(f"{base}:{pid}")
            if budget is not None and not (once is not None and self._counts(f"{base}:{pid}", once)):
                budget[0] += actual_tokens - reserved_tokens
                budget[1] += actual_picos - reserved_micros * PICOS_PER_MICRO
        return completed()

    def _counts(self, bucket: str, once: str) -> bool:
        """Whether ``bucket`` was rebuilt holding the charge under ``once`` (its note goes)."""
        counted = self._counted.get(bucket)
        if counted is None or once not in counted:
            return False
        counted.discard(once)
        if not counted:
            del self._counted[bucket]
        return True

    def _first(self, once: str, now: float) -> bool:
        """Note the once-key ``once`` unless it is held; the keys that ran out go first (each is kept
        as long: the oldest is the first to go)."""
        while self._once and next(iter(self._once.values())) <= now:
            del self._once[next(iter(self._once))]
        if self._once.get(once, now) > now:
            return False
        self._once.pop(once, None)
        self._once[once] = now + ONCE_SECONDS
        return True
