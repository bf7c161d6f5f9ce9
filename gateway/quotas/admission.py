"""The Admission the request path uses: limits from SQL, counting in a QuotaStore.

``admit`` reserves one request, ``reserve_tokens`` tokens and their worst-case price (plus the
worst-case fees of the priced tools it enables, ``PriceTable.tool_reserve``) for the key and its
tenant in one atomic store call; ``settle`` releases the concurrency lease and corrects
tokens and money to the actual figures; it is sent at once and acknowledged later, so a reply
never waits for it (commands on one connection run in order: this process's next admission sees
it). Concurrency leases last ``lease_seconds`` and a heartbeat
(``start``) renews this process's live ones every third of that, so the slots of a replica that
died free themselves within one lease. A budget bucket the store lost is rebuilt from the usage
records before the request is admitted, once this process's own records still on their way to the
database (the usage writer's buffer and journal: ``flush_records``) are in it: the requests settled
here while no bucket was there to count them (a budget just set, a Redis restarted) are counted.
(Another replica's records on their way are not: up to its writer's flush interval of spend.)
A background response's charge (``charge(..., once=)``) whose usage record the rebuilt bucket holds
adds nothing to it (``recorded.py``).
A store outage (or, for a lost budget bucket, a database outage) follows the configured policy:
``fail_closed`` raises QuotaUnavailable (503), ``fail_open`` admits without counting; both log.
The budget buckets that missed spend meanwhile (requests admitted without counting, settlements
not acknowledged) are rebuilt from the usage records once the store answers again (``stale.py``),
before this process's next admission.
With ``credit`` (Redis), a key admitted at least ``credit.MIN_DEMAND`` times a second is admitted
and settled in process while this replica's credit for the second lasts (``credit.py``), and
through the store otherwise.
``admit_poll`` counts a request that spends nothing itself (a read or cancel of a stored response)
against requests/min alone, through the store (``Reservation.requests_only``): nothing to settle.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal

from gateway.background import stop_task
from gateway.contracts import Principal, QuotaExceeded, QuotaUnavailable, Ticket, completed
from gateway.ids import random_id
from gateway.quotas.credit import CreditKeeper, LocalLease
from gateway.quotas.limits import LimitsSource, Scope, period_id, period_start
from gateway.quotas.recorded import recorded_spend
from gateway.quotas.redis_credit import RedisCredit
from gateway.quotas.stale import StaleBudgets, Uncounted
from gateway.quotas.store import Decision, Lease, QuotaStore, Reservation, lease_for, picos
from gateway.usage.pricing import HostedTools, PriceTable

log = logging.getLogger("switchyard.quotas")

SETTLE_WAIT_SECONDS = 5.0  # at shutdown, for the settlements sent to be acknowledged
MAX_HOLD_SECONDS = 6 * 3600  # the heartbeat stops renewing a lease this old (a request never settled)

REASONS = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
    "token_budget": "token budget",
    "cost_budget": "spending budget",
}


class QuotaAdmission:
    def __init__(
        self,
        store: QuotaStore,
        limits: LimitsSource,
        prices: PriceTable,
        *,
        on_unavailable: Literal["fail_closed", "fail_open"] = "fail_closed",
        lease_seconds: float = 30.0,
        credit: RedisCredit | None = None,
        flush_records: Callable[[], Awaitable[bool]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.limits = limits
        self.prices = prices
        self.on_unavailable = on_unavailable
        self.lease_seconds = lease_seconds
        self._last_outage_log = 0.0
        self._live: dict[str, Lease] = {}  # ticket id -> lease of every admitted, unsettled request
        self._settling: set[asyncio.Future[None]] = set()  # settlements sent and not yet acknowledged
        self._heartbeat: asyncio.Task[None] | None = None
        self._done: asyncio.Future[None] | None = None  # what a settlement with nothing to send returns
        self.flush_records = flush_records  # the usage records written here into the database; False: not all
        self.clock = clock
        # buckets that missed spend in an outage
        self.stale = StaleBudgets(store, limits, flush_records, lease_seconds=lease_seconds, clock=clock)
        # busy keys are admitted on credit (credit.py); not while a bucket is to be rebuilt
        self.credit = (CreditKeeper(credit, lease_seconds=lease_seconds, on_outage=self._outage, clock=clock,
                                    blocked=self.stale.__bool__) if credit else None)

    # ------------------------------------------------------------ heartbeat

    def start(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name="quota-heartbeat")
            self._done = completed()  # made once in the serving loop: a loop lookup is a system call on 3.11
        if self.credit is not None:
            self.credit.start()

    async def aclose(self) -> None:
        """Stop the heartbeat, once the settlements on their way are acknowledged (or time out)."""
        if self._settling:
            await asyncio.wait(list(self._settling), timeout=SETTLE_WAIT_SECONDS)
        if self.credit is not None:
            await self.credit.aclose()
        await self.stale.aclose()
        if self._heartbeat is not None:
            await stop_task(self._heartbeat)
            self._heartbeat = self._done = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            now = time.time()
            for stale in [t for t, lease in self._live.items() if now - lease.second > MAX_HOLD_SECONDS]:
                del self._live[stale]  # never settled (a bug): let its slot expire rather than hold it forever
            leases = list(self._live.values())
            try:
                for i in range(0, len(leases), 500):
                    # those settled while an earlier batch was sent are left out: a renewal takes a
                    # dropped lease back, and would hold a settled one until it expired
                    batch = [lease for lease in leases[i : i + 500] if lease.ticket_id in self._live]
                    await self.store.renew(batch, time.time(), self.lease_seconds)
            except Exception as exc:  # the store is down: the leases run out by themselves
                self._outage("lease renewal", exc)

    # ------------------------------------------------------------ admission

    async def admit(self, principal: Principal, model: str, reserve_tokens: int,
                    output_field: str | None = "max_tokens", tools: HostedTools | None = None) -> Ticket:
        reserve_tokens = max(0, int(reserve_tokens))
        try:
            scopes = await self.limits.scopes(principal)
        except Exception as exc:  # the database is down and nothing usable is cached
            self._outage("limits lookup", exc)
            if self.on_unavailable == "fail_open":
                return Ticket(principal=principal, model=model, reserved_tokens=0,
                              reservation=Uncounted(None, self.clock(), None))
            raise QuotaUnavailable("quota limits unavailable; try again shortly") from None
        if self.stale.due():  # budgets that missed spend in an outage: rebuilt first, if Redis is back
            await self.stale.repair()
        fees = self.prices.tool_reserve(model, tools) if tools is not None else 0.0
        micros = math.ceil(reserve_tokens * self.prices.max_per_million(model) + fees * 1_000_000)
        if self.credit is not None and (ticket := self.credit.take(principal, scopes, model, reserve_tokens, micros)):
            return ticket
        r = Reservation(random_id(), self.clock(), reserve_tokens, micros, scopes, self.lease_seconds)
        try:
            decision = await self.store.reserve(r)
            for _ in scopes:  # each pass rebuilds one lost budget bucket
                if decision.reason != "unseeded":
                    break
                await self._seed_budget(scopes[decision.scope_index], r.now)
                decision = await self.store.reserve(r)
        except asyncio.CancelledError:  # the client left while the store reserved: give back what it may hold
            self._give_back(r)
            raise
        except Exception as exc:  # the store (Redis), or the records a lost bucket is rebuilt from
            self._outage("admit", exc)
            if self.on_unavailable == "fail_open":  # (the store may have run the reservation: its answer was lost)
                return Ticket(principal=principal, model=model, reserved_tokens=0,
                              reservation=Uncounted(scopes, r.now, lease_for(r)))
            raise QuotaUnavailable("rate limit service unavailable; try again shortly") from None
        ticket = Ticket(
            principal=principal,
            model=model,
            reserved_tokens=reserve_tokens,
            requests=decision.requests,
            tokens=decision.tokens,
        )
        if not decision.admitted:
            budget = decision.reason in BUDGETS
            reserved = _reserved(output_field, fees > 0)
            if never := _never_admitted(decision, scopes, reserve_tokens, micros, reserved):
                message, too_large = never  # a request larger than a whole budget: shrink it, not a spent budget
                raise QuotaExceeded(message, retry_after=None, ticket=ticket, budget=budget and not too_large)
            raise QuotaExceeded(_message(decision, scopes, reserve_tokens, micros, reserved),
                                retry_after=decision.retry_after, ticket=ticket, budget=budget)
        lease = ticket.reservation = lease_for(r)
        self._live[lease.ticket_id] = lease
        if self.credit is not None:
            self.credit.hold(principal)
        return ticket

    async def admit_poll(self, principal: Principal) -> Ticket:
        """Count one request against the requests/min of the key and its tenant, and nothing else (a
        poll: ``Reservation.requests_only``): a read or cancel of a stored response, which spends
        nothing itself. Neither tokens/min nor concurrency nor a spent budget refuses it, and it
        holds nothing to settle; credit (``credit.py``) is not used for it. An outage follows the
        configured policy, as ``admit``'s."""
        try:
            scopes = await self.limits.scopes(principal)
            r = Reservation(random_id(), self.clock(), 0, 0, scopes, self.lease_seconds, requests_only=True)
            decision = await self.store.reserve(r)
        except Exception as exc:  # the database (limits) or the store is down
            self._outage("admit", exc)
            if self.on_unavailable == "fail_open":
                return Ticket(principal=principal, model="", reserved_tokens=0)
            raise QuotaUnavailable("rate limit service unavailable; try again shortly") from None
        ticket = Ticket(principal=principal, model="", reserved_tokens=0, requests=decision.requests,
                        tokens=decision.tokens)
        if not decision.admitted:
            if never := _never_admitted(decision, scopes, 0, 0, _reserved(None)):
                raise QuotaExceeded(never[0], retry_after=None, ticket=ticket)
            raise QuotaExceeded(_message(decision, scopes, 0, 0, _reserved(None)), retry_after=decision.retry_after,
                                ticket=ticket)
        return ticket

    async def _seed_budget(self, scope: Scope, now: float) -> None:
        """Rebuild a budget bucket the store does not hold from the usage records (the store is new,
        or restarted empty, or the budget was just set) and the reservations in flight; the charges
        to come of background responses whose usage rows it counted are noted in it, to add nothing
        to it (``recorded.py``). A database outage here is an outage of admission."""
        pid, ttl = period_id(scope.limits.budget_period, now)
        if self.flush_records is not None and not await self.flush_records():
            log.warning("rebuilding the budget of %s while some of this process's usage records are not in the "
                        "database yet: their spend is not counted", scope.label)
        spent = await recorded_spend(self.limits.db, scope, now)
        log.info("budget of %s rebuilt from the usage records: %d tokens, %.6f USD (%d background charges to "
                 "come counted)", scope.label, spent.tokens, spent.picos / 1e12, len(spent.counted))
        await self.store.seed_budget(scope.kind, scope.id, pid, spent.tokens, spent.picos, ttl, now,
                                     period_start(scope.limits.budget_period, now), counted=spent.counted)

    def settle(self, ticket: Ticket, actual_tokens: int, cost: float) -> asyncio.Future[None]:
        lease = ticket.reservation
        if isinstance(lease, LocalLease):
            assert self.credit is not None
            self.credit.settle(lease, max(0, int(actual_tokens)), picos(cost))
            return self._done or completed()  # the corrections leave with the next second's give-back
        if isinstance(lease, Uncounted):  # admitted fail-open: its bucket is rebuilt once the store is back
            self.stale.uncounted(ticket.principal, lease)
            return self._done or completed()
        if not isinstance(lease, Lease):
            return self._done or completed()  # nothing was reserved
        if self.credit is not None:
            self.credit.release(ticket.principal)
        self._live.pop(lease.ticket_id, None)
        try:
            sent = self.store.settle(lease, self.clock(), max(0, int(actual_tokens)), picos(cost))
        except Exception as exc:  # the lease expires by itself; the bucket is rebuilt once the store is back
            self._outage("settle", exc)
            self.stale.unsettled(lease)
            return completed()
        acknowledged: asyncio.Future[None] = sent.get_loop().create_future()  # not a lookup: a system call on 3.11
        self._settling.add(acknowledged)
        sent.add_done_callback(partial(self._acknowledged, acknowledged, lease))
        return acknowledged

    async def charge(self, principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        """Add ``tokens`` and ``cost`` to the budgets (and this second's tokens) of the key and its
        tenant: the store settles a reservation it never held by adding its actual figures, unless
        it settled one under ``once`` before (within ``store.ONCE_SECONDS``), in the same atomic step."""
        now = self.clock()
        try:
            scopes = await self.limits.scopes(principal)
        except Exception as exc:  # its buckets are found, and rebuilt, once the limits can be read
            self._outage("charge", exc)
            self.stale.uncounted(principal, Uncounted(None, now, None))
            return
        lease = lease_for(Reservation(random_id(), now, 0, 0, scopes, self.lease_seconds))
        try:
            await self.store.settle(lease, now, max(0, int(tokens)), picos(cost), given_back=True, once=once)
        except Exception as exc:  # it may or may not have run: the buckets are rebuilt from the usage records
            self._outage("charge", exc)
            self.stale.unsettled(lease)

    def _give_back(self, r: Reservation) -> None:
        """Settle a reservation whose answer nobody waits for at zero: it frees what the store holds
        for it if the reservation was made (the store runs it after the reservation), and changes
        nothing if it was refused or never ran (a ticket the store does not hold adds its actual
        figures, zero)."""
        try:
            sent = self.store.settle(lease_for(r), self.clock(), 0, 0, given_back=True)
        except Exception as exc:  # the lease expires by itself
            self._outage("settle", exc)
            return
        sent.add_done_callback(self._given_back)

    def _given_back(self, reply: asyncio.Future[Any]) -> None:
        if not reply.cancelled() and isinstance(exc := reply.exception(), Exception):
            self._outage("settle", exc)  # the lease expires by itself

    def _acknowledged(self, acknowledged: asyncio.Future[None], lease: Lease, reply: asyncio.Future[Any]) -> None:
        self._settling.discard(acknowledged)
        if not reply.cancelled() and isinstance(exc := reply.exception(), Exception):
            self._outage("settle", exc)  # it may or may not have run: the bucket is rebuilt once the store is back
            self.stale.unsettled(lease)
        if not acknowledged.done():
            acknowledged.set_result(None)

    def _outage(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_outage_log > 5:
            self._last_outage_log = now
            log.error(
                "quota store unavailable during %s (%s: %s); policy %s",
                what,
                type(exc).__name__,
                exc,
                self.on_unavailable,
            )


BUDGETS = frozenset({"token_budget", "cost_budget"})
PER_PERIOD = {"day": " a day", "month": " a month", "total": " in all"}


def _reserved(output_field: str | None, tools: bool = False) -> tuple[str, str]:
    """What a request reserves, and what the client may reduce, for the field that caps its output
    (None: a request that generates nothing reserves its input alone) and the priced tools it enables."""
    if output_field is None:
        return "its input", "the input"
    if tools:
        return (f"its prompt plus {output_field} for each choice, and the calls of its priced tools",
                f"the prompt, {output_field} or the priced tools' calls (max_tool_calls, a tool's max_uses)")
    return f"its prompt plus {output_field} for each choice", f"the prompt or {output_field}"


def _never_admitted(decision: Decision, scopes: list[Scope], tokens: int, micros: int,
                    reserved_as: tuple[str, str]) -> tuple[str, bool] | None:
    """The message of a refusal that no wait ends (a limit of zero, one smaller than what the
    request alone reserves, or a budget that never resets without enough left), and whether the
    request alone is too large for the limit; or None."""
    if not 0 <= decision.scope_index < len(scopes):
        return None
    scope = scopes[decision.scope_index]
    lim, what = scope.limits, REASONS.get(decision.reason, decision.reason)
    limit = {"requests": lim.requests_per_minute, "tokens": lim.tokens_per_minute, "concurrency": lim.max_concurrency,
             "token_budget": lim.token_budget, "cost_budget": lim.cost_budget}.get(decision.reason)
    if limit is None:
        return None
    if limit == 0:
        return f"The {scope.kind}'s limit on {what} is 0: it admits no requests.", False
    reserved, lower = reserved_as
    budget = decision.reason.endswith("budget")
    per = PER_PERIOD.get(lim.budget_period, "") if budget else ""
    if decision.reason in ("tokens", "token_budget") and tokens > limit:
        asked = f"limit {limit}{per}, requested {tokens}"
    elif decision.reason == "cost_budget" and micros > round(limit * 1e6):
        asked = f"limit {limit:g} USD{per}, requested up to {micros / 1e6:g} USD"
    elif budget and lim.budget_period == "total":
        asks = f"{tokens} tokens" if decision.reason == "token_budget" else f"up to {micros / 1e6:g} USD"
        return (f"Your {scope.kind}'s {what} (in all: it never resets) is spent, or has too little left for this "
                f"request, which reserves {asks} ({reserved}). No wait restores it: an admin must raise the "
                f"budget (or, if some is left, reduce {lower})."), False
    else:
        return None
    return f"Request too large for {scope.kind} on {what}: {asked} ({reserved}); reduce {lower}.", True


def _message(decision: Decision, scopes: list[Scope], tokens: int, micros: int, reserved_as: tuple[str, str]) -> str:
    found = scopes[decision.scope_index] if 0 <= decision.scope_index < len(scopes) else None
    scope = found.kind if found else "key"
    what = REASONS.get(decision.reason, decision.reason)
    if decision.reason in ("token_budget", "cost_budget"):  # not enough left for this reservation this period
        reserved, lower = reserved_as
        asks = f"{tokens} tokens" if decision.reason == "token_budget" else f"up to {micros / 1e6:g} USD"
        return (f"Your {scope}'s {what} for this period has too little left for this request, which reserves "
                f"{asks} ({reserved}); wait for the next period, or reduce {lower}.")
    return f"Rate limit reached for {scope} on {what}; retry after {math.ceil(decision.retry_after)} s."
