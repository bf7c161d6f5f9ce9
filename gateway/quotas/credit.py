"""Admission credit: a busy key's admissions counted in Redis once a second, not once a request.

Each second a replica asks Redis (``redis_credit.GRANT``) for credit for every key it admitted at
least ``MIN_DEMAND`` requests for in the second before: half again that second's requests, tokens
and money, for this second only, counted in Redis at once against every limit of the key and its
tenant (so no replica ever admits past a limit), plus concurrency slots for the requests it has
in flight; each as much of that as is left of the limit and at most a sixteenth of it. While the
credit lasts a request is admitted in this process (``take``: no round trip)
and settled here (its slot back in the pool, its token and money corrections summed); a request
the credit does not cover goes to Redis as before (``QuotaStore.reserve``). At the next second the
replica hands back what it did not use, with the corrections (``GIVE_BACK``, not waited for), and
takes the next second's credit.

What credit costs: what one replica holds and has not used (at most a sixteenth of a limit, for at
most a second; slots until the next second) is refused to the others meanwhile, and a request's
``x-ratelimit-remaining-*`` counts down from the state at the grant, not the other replicas' use
since. A key below ``MIN_DEMAND`` requests a second is never on credit, and a request the credit
does not cover (nothing left of it, or no free slot) is counted request by request, exactly as
without: a key near a limit gets at most what is left of it. A change of the key's or its tenant's
limits (once the limits cache sees it) ends the credit granted under the old ones at once, and a
lowered concurrency limit shrinks the pool to a sixteenth of it. A replica that dies holds its
credit until the second ends and its slots until their lease runs out, as it holds its tickets.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.background import stop_task
from gateway.contracts import Principal, QuotaState, Ticket
from gateway.ids import random_id
from gateway.quotas.limits import Scope, period_id
from gateway.quotas.redis_credit import GiveBack, Grant, RedisCredit
from gateway.quotas.store import PICOS_PER_MICRO

log = logging.getLogger("switchyard.quotas")

MIN_DEMAND = 20  # admissions of a key in a second before it is worth a credit
MARGIN = 1.5  # a second's credit: this much of the second before's demand
NO_CAP = 2**63  # pool slots a key without a concurrency limit may use
GIVE_BACK_WAIT_SECONDS = 5.0  # at shutdown, for the last give-back to be acknowledged


@dataclass(eq=False)
class Bundle:
    """One key's scopes (the key, its tenant) as this replica admits them: demand, credit, slots."""

    prefix: str  # its slots' members: this process's prefix and the bundle's number
    scopes: list[Scope]
    granted_under: list[Scope] = field(default_factory=list)  # the scopes (limits) of the credit held
    # demand: admissions (on credit or not) of the second ``demand_second`` and of the one before
    demand_second: int = -1
    demand: tuple[int, int, int] = (0, 0, 0)  # requests, tokens, micros
    before: tuple[int, int, int] = (0, 0, 0)
    in_flight: int = 0  # admitted and not settled, on credit or not
    peak: int = 0  # the most in flight since the last tick
    # credit for second ``second``
    second: int = -1
    requests: int = 0
    tokens: int = 0
    micros: int = 0
    used: int = 0  # requests admitted on it (for the headers)
    used_tokens: int = 0
    states: tuple[QuotaState | None, QuotaState | None] = (None, None)  # at the grant
    granted_at: float = 0.0
    # concurrency slots: numbers held in Redis, the free ones, the next number
    pool: set[int] = field(default_factory=set)
    free: list[int] = field(default_factory=list)
    next_slot: int = 0
    granting: bool = False  # a request for credit is on its way
    refused: int = -1  # the second credit was last refused in (no more asking in it)
    # corrections to send: second -> [requests, tokens, picos]
    pending: dict[int, list[int]] = field(default_factory=dict)

    def count(self, sec: int, tokens: int, micros: int) -> None:
        if sec != self.demand_second:
            self.before = self.demand if sec == self.demand_second + 1 else (0, 0, 0)
            self.demand, self.demand_second = (0, 0, 0), sec
        r, t, m = self.demand
        self.demand = (r + 1, t + tokens, m + micros)

    def demand_before(self, sec: int) -> tuple[int, int, int]:
        """The demand of second ``sec - 1``."""
        if self.demand_second == sec:
            return self.before
        return self.demand if self.demand_second == sec - 1 else (0, 0, 0)

    def correct(self, sec: int, requests: int, tokens: int, picos: int) -> None:
        entry = self.pending.setdefault(sec, [0, 0, 0])
        entry[0] += requests
        entry[1] += tokens
        entry[2] += picos

    def retire(self, sec: int) -> None:
        """Move what is left of a credit older than ``sec`` to the corrections to send."""
        if self.second >= 0 and (self.second < sec or sec < 0):
            if self.requests or self.tokens or self.micros:
                self.correct(self.second, -self.requests, -self.tokens, -self.micros * PICOS_PER_MICRO)
            self.second, self.requests, self.tokens, self.micros = -1, 0, 0, 0

    def idle(self, sec: int) -> bool:
        """Nothing held, nothing to send, no admission this second or the one before."""
        return not (self.in_flight or self.pool or self.pending or self.second >= 0) and self.demand_second < sec - 1


@dataclass(slots=True)
class LocalLease:
    """A request admitted on credit: its slot and what it reserved, for ``CreditKeeper.settle``."""

    bundle: Bundle
    slot: int
    second: int
    tokens: int
    micros: int  # reserved


class CreditKeeper:
    def __init__(self, store: RedisCredit, *, lease_seconds: float, on_outage: Callable[[str, Exception], None],
                 clock: Callable[[], float] = time.time, blocked: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.blocked = blocked  # no credit meanwhile (budget buckets to rebuild: stale.py)
        self.lease_seconds = lease_seconds
        self.on_outage = on_outage
        self.clock = clock
        self.prefix = f"pool:{random_id()}:"  # this process's slots, apart from every other replica's
        self._bundles: dict[tuple[str, str | None], Bundle] = {}
        self._numbers = 0
        self._task: asyncio.Task[None] | None = None
        self._sent: set[asyncio.Future[object]] = set()
        self._granting: set[asyncio.Task[None]] = set()
        self._last_renewal = 0.0

    # ------------------------------------------------------------ the request path

    def take(self, principal: Principal, scopes: list[Scope], model: str, tokens: int, micros: int) -> Ticket | None:
        """A ticket on credit, or None (the caller reserves in the store, then calls ``hold``)."""
        who = (principal.key_id, principal.tenant_id)
        bundle = self._bundles.get(who)
        if bundle is None:
            self._numbers += 1
            bundle = self._bundles[who] = Bundle(f"{self.prefix}{self._numbers}:", scopes)
        if bundle.second >= 0 and scopes is not bundle.granted_under and scopes != bundle.granted_under:
            bundle.retire(-1)  # granted under limits since changed: the store admits, exactly, until the next grant
        bundle.scopes = scopes  # the limits as now cached: the next grant uses them
        now = self.clock()
        sec = math.floor(now)
        bundle.count(sec, tokens, micros)
        short = bundle.second != sec or bundle.requests < 1 or bundle.tokens < tokens or bundle.micros < micros
        full = not bundle.free or len(bundle.pool) - len(bundle.free) >= _slot_cap(scopes)
        if short or full:
            if bundle.demand[0] >= MIN_DEMAND and not bundle.granting and bundle.refused != sec:
                self._top_up(bundle, now, tokens, micros, slots_only=full)
            return None
        bundle.requests -= 1
        bundle.tokens -= tokens
        bundle.micros -= micros
        bundle.used += 1
        bundle.used_tokens += tokens
        self._hold(bundle)
        lease = LocalLease(bundle, bundle.free.pop(), sec, tokens, micros)
        requests, token_state = bundle.states
        gone = now - bundle.granted_at
        return Ticket(principal=principal, model=model, reserved_tokens=tokens,
                      requests=_less(requests, bundle.used, gone), tokens=_less(token_state, bundle.used_tokens, gone),
                      reservation=lease)

    def hold(self, principal: Principal) -> None:
        """Count a request the store admitted as in flight (for the size of the pool)."""
        bundle = self._bundles.get((principal.key_id, principal.tenant_id))
        if bundle is not None:
            self._hold(bundle)

    @staticmethod
    def _hold(bundle: Bundle) -> None:
        bundle.in_flight += 1
        if bundle.in_flight > bundle.peak:
            bundle.peak = bundle.in_flight

    def release(self, principal: Principal) -> None:
        """A request the store admitted has settled."""
        bundle = self._bundles.get((principal.key_id, principal.tenant_id))
        if bundle is not None and bundle.in_flight > 0:
            bundle.in_flight -= 1

    def settle(self, lease: LocalLease, actual_tokens: int, actual_picos: int) -> None:
        bundle = lease.bundle
        bundle.in_flight -= 1
        if lease.slot in bundle.pool:
            bundle.free.append(lease.slot)
        if actual_tokens != lease.tokens or actual_picos != lease.micros * PICOS_PER_MICRO:
            bundle.correct(lease.second, 0, actual_tokens - lease.tokens, actual_picos - lease.micros * PICOS_PER_MICRO)

    # ------------------------------------------------------------ once a second

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="quota-credit")

    async def aclose(self) -> None:
        """Stop granting; hand back every credit, correction and free slot, and wait for Redis."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        if self._granting:
            await asyncio.wait(list(self._granting), timeout=GIVE_BACK_WAIT_SECONDS)
        for bundle in self._bundles.values():
            bundle.retire(-1)
            self._give_back(bundle, -1)
        if self._sent:
            await asyncio.wait(list(self._sent), timeout=GIVE_BACK_WAIT_SECONDS)

    async def _run(self) -> None:
        while True:
            now = self.clock()
            await asyncio.sleep(math.floor(now) + 1.002 - now)  # just past the next second's start
            try:
                await self.tick()
            except Exception as exc:  # a bug: credit stops, admission goes on through the store
                log.exception("admission credit failed: %s", exc)

    async def tick(self) -> None:
        """Hand back the seconds before; take this second's credit for the keys that need it."""
        now = self.clock()
        sec = math.floor(now)
        grants = []
        for who, bundle in list(self._bundles.items()):
            bundle.retire(sec)
            requests, tokens, micros = bundle.demand_before(sec)
            wanted = requests >= MIN_DEMAND
            # slots: as many as were in flight at once since the last tick, and a quarter more
            target = min(math.ceil(bundle.peak * 1.25) + 2, _slot_cap(bundle.scopes)) if wanted else 0
            bundle.peak = bundle.in_flight
            self._give_back(bundle, target)
            if wanted and not bundle.granting:
                grants.append(self._take_credit(bundle, now, math.ceil(requests * MARGIN), math.ceil(tokens * MARGIN),
                                                math.ceil(micros * MARGIN), target))
            elif bundle.idle(sec):
                del self._bundles[who]
        if grants:
            await asyncio.gather(*grants)
        if now - self._last_renewal >= self.lease_seconds / 3:
            self._last_renewal = now
            await self._renew(now)

    async def _take_credit(self, bundle: Bundle, now: float, requests: int, tokens: int, micros: int,
                           target: int) -> None:
        sec = math.floor(now)
        scopes = bundle.scopes
        wanted = range(bundle.next_slot, bundle.next_slot + max(0, target - len(bundle.pool)))
        bundle.next_slot = wanted.stop
        bundle.granting = True
        try:
            grant: Grant = Grant(False) if self.blocked() else await self.store.grant(
                scopes, now, requests, tokens, micros, bundle.prefix, wanted, len(bundle.pool), self.lease_seconds)
        except Exception as exc:
            self.on_outage("admission credit", exc)
            grant = Grant(False)
        finally:
            bundle.granting = False
        if not grant.granted:  # near a limit, or a budget to rebuild: request by request for this second,
            bundle.refused = sec
            self._give_back(bundle, 0)  # and no idle slots held against the concurrency limit meanwhile
            return
        requests, tokens, micros, grown = grant.credit
        slots = wanted[:grown]
        bundle.pool.update(slots)
        bundle.free.extend(slots)
        if bundle.second > sec:  # a later second's credit came first: this one goes back
            bundle.correct(sec, -requests, -tokens, -micros * PICOS_PER_MICRO)
            return
        bundle.retire(sec)
        bundle.second, bundle.granted_under = sec, scopes
        bundle.requests += requests
        bundle.tokens += tokens
        bundle.micros += micros
        bundle.used = bundle.used_tokens = 0
        bundle.states, bundle.granted_at = (grant.requests, grant.tokens), now

    def _top_up(self, bundle: Bundle, now: float, tokens: int, micros: int, *, slots_only: bool) -> None:
        """Ask for more of this second's credit, not waited for: as much again as this second's
        demand so far (a key that has just become busy is on credit within a few dozen requests);
        with no slot free, slots alone first (credit that no slot could use would be held from the
        other replicas for nothing)."""
        requests, demand_tokens, demand_micros = (0, 0, 0) if slots_only else bundle.demand
        target = math.ceil(bundle.peak * 1.25) + 2
        task = asyncio.get_running_loop().create_task(self._take_credit(
            bundle, now, requests, max(demand_tokens, 2 * tokens) if requests else 0,
            max(demand_micros, 2 * micros) if requests else 0, target))
        self._granting.add(task)
        task.add_done_callback(self._granting.discard)

    def _give_back(self, bundle: Bundle, target: int) -> None:
        """Send the corrections, and let go of free slots beyond ``target`` (-1: all slots)."""
        let_go: list[int] = []
        while bundle.free and (target < 0 or len(bundle.pool) > target):
            slot = bundle.free.pop()
            bundle.pool.discard(slot)
            let_go.append(slot)
        if target < 0:
            let_go += bundle.pool
            bundle.pool.clear()
        groups: dict[tuple[str, ...], list[int]] = {}  # seconds by the budget periods they fall in
        for sec in bundle.pending:
            groups.setdefault(tuple(period_id(s.limits.budget_period, sec)[0] for s in bundle.scopes), []).append(sec)
        if not groups and let_go:
            groups[()] = []
        for seconds in groups.values():
            changes = [bundle.pending.pop(s) for s in seconds]
            back = GiveBack([(s, c[0], c[1]) for s, c in zip(seconds, changes, strict=True)],
                            sum(c[1] for c in changes), sum(c[2] for c in changes), let_go)
            let_go = []
            try:
                sent = self.store.give_back(bundle.scopes, seconds[0] if seconds else self.clock(), bundle.prefix, back)
            except Exception as exc:  # the budget keeps what was reserved; the slots run out by themselves
                self.on_outage("admission credit", exc)
                continue
            self._sent.add(sent)
            sent.add_done_callback(self._acknowledged)

    def _acknowledged(self, reply: asyncio.Future[object]) -> None:
        self._sent.discard(reply)
        if not reply.cancelled() and isinstance(exc := reply.exception(), Exception):
            self.on_outage("admission credit", exc)

    async def _renew(self, now: float) -> None:
        for bundle in list(self._bundles.values()):
            if bundle.pool:
                try:
                    await self.store.renew(bundle.scopes, now, bundle.prefix, sorted(bundle.pool), self.lease_seconds)
                except Exception as exc:  # the slots run out by themselves
                    self.on_outage("slot renewal", exc)


def _slot_cap(scopes: list[Scope]) -> int:
    """The most pool slots the scopes' concurrency limits, as now cached, let a replica use: a
    sixteenth of each, as a grant gives (a pool granted under a higher limit shrinks to it)."""
    return min((s.limits.max_concurrency // 16 for s in scopes if s.limits.max_concurrency is not None),
               default=NO_CAP)


def _less(state: QuotaState | None, used: int, gone: float) -> QuotaState | None:
    """A limit's state at the grant, after ``used`` more and ``gone`` seconds."""
    if state is None:
        return None
    return QuotaState(limit=state.limit, remaining=max(0, state.remaining - used),
                      reset_seconds=max(0.0, state.reset_seconds - gone))
