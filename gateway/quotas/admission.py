"""The Admission the request path uses: limits from SQL, counting in a QuotaStore.

``admit`` reserves one request, ``reserve_tokens`` tokens and their worst-case price for the key
and its tenant in one atomic store call; ``settle`` releases the concurrency lease and corrects
tokens and money to the actual figures. A store outage follows the configured policy:
``fail_closed`` raises QuotaUnavailable (503), ``fail_open`` admits without counting; both log.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from typing import Literal

import msgspec

from gateway.contracts import Principal, QuotaExceeded, QuotaUnavailable, Ticket
from gateway.quotas.limits import LimitsSource, Scope, period_id, recorded_spend
from gateway.quotas.store import Decision, Lease, QuotaStore, Reservation, lease_for
from gateway.usage.pricing import PriceTable

log = logging.getLogger("switchyard.quotas")

REASONS = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "concurrent requests",
    "token_budget": "token budget",
    "cost_budget": "spending budget",
}


class _LeaseWire(msgspec.Struct, array_like=True):
    ticket_id: str
    second: int
    tokens: int
    micros: int
    scopes: list[tuple[str, str, str]]


class QuotaAdmission:
    def __init__(
        self,
        store: QuotaStore,
        limits: LimitsSource,
        prices: PriceTable,
        *,
        on_unavailable: Literal["fail_closed", "fail_open"] = "fail_closed",
        lease_seconds: float = 3600.0,
    ) -> None:
        self.store = store
        self.limits = limits
        self.prices = prices
        self.on_unavailable = on_unavailable
        self.lease_seconds = lease_seconds
        self._last_outage_log = 0.0
        self._seeded: set[tuple[str, str, str]] = set()

    async def admit(self, principal: Principal, model: str, reserve_tokens: int) -> Ticket:
        reserve_tokens = max(0, int(reserve_tokens))
        try:
            scopes = await self.limits.scopes(principal)
        except Exception as exc:  # the database is down and nothing usable is cached
            self._outage("limits lookup", exc)
            if self.on_unavailable == "fail_open":
                return Ticket(principal=principal, model=model, reserved_tokens=0)
            raise QuotaUnavailable("quota limits unavailable; try again shortly") from None
        micros = math.ceil(reserve_tokens * self.prices.max_per_million(model))
        r = Reservation(secrets.token_hex(16), time.time(), reserve_tokens, micros, scopes, self.lease_seconds)
        try:
            await self._seed_budgets(scopes, r.now)
            decision = await self.store.reserve(r)
        except Exception as exc:  # the store (Redis) is unreachable or failing
            self._outage("admit", exc)
            if self.on_unavailable == "fail_open":
                return Ticket(principal=principal, model=model, reserved_tokens=0)
            raise QuotaUnavailable("rate limit service unavailable; try again shortly") from None
        ticket = Ticket(
            principal=principal,
            model=model,
            reserved_tokens=reserve_tokens,
            requests=decision.requests,
            tokens=decision.tokens,
        )
        if not decision.admitted:
            raise QuotaExceeded(_message(decision, scopes), retry_after=decision.retry_after, ticket=ticket)
        lease = lease_for(r)
        ticket.token = msgspec.json.encode(_LeaseWire(**lease.__dict__)).decode()
        return ticket

    async def _seed_budgets(self, scopes: list[Scope], now: float) -> None:
        """The first time this process meets a budget bucket, make sure the store counts what the
        usage records already show (the store may have restarted since they were written)."""
        for scope in scopes:
            lim = scope.limits
            if lim.token_budget is None and lim.cost_budget is None:
                continue
            pid, ttl = period_id(lim.budget_period, now)
            mark = (scope.kind, scope.id, pid)
            if mark in self._seeded:
                continue
            try:
                tokens, micros = await recorded_spend(self.limits.db, scope, now)
            except Exception as exc:  # database down: the store's own counts stand; try again later
                log.warning(
                    "cannot read recorded spend for %s (%s); budget counted from the store only", scope.label, exc
                )
                continue
            await self.store.seed_budget(scope.kind, scope.id, pid, tokens, micros, ttl)
            if len(self._seeded) > 100_000:
                self._seeded.clear()
            self._seeded.add(mark)

    async def settle(self, ticket: Ticket, actual_tokens: int, cost: float) -> None:
        if not ticket.token:
            return  # admitted fail-open: nothing was reserved
        wire = msgspec.json.decode(ticket.token, type=_LeaseWire)
        lease = Lease(wire.ticket_id, wire.second, wire.tokens, wire.micros, [tuple(s) for s in wire.scopes])  # type: ignore[misc]
        try:
            await self.store.settle(lease, time.time(), max(0, int(actual_tokens)), round(cost * 1e6))
        except Exception as exc:  # the lease expires by itself; the budget keeps the reservation
            self._outage("settle", exc)

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


def _message(decision: Decision, scopes: list[Scope]) -> str:
    scope = scopes[decision.scope_index].kind if 0 <= decision.scope_index < len(scopes) else "key"
    what = REASONS.get(decision.reason, decision.reason)
    if decision.reason in ("token_budget", "cost_budget"):
        return f"Your {scope}'s {what} for this period is exhausted."
    return f"Rate limit reached for {scope} on {what}; retry after {math.ceil(decision.retry_after)} s."
