"""Budget buckets that missed spend while the store was unreachable, and their repair.

Under ``fail_open`` a request admitted while Redis could not be reached reserved nothing (or its
reservation ran in Redis after its answer was lost: a paused Redis), and a settlement Redis did not
acknowledge may or may not have corrected its reservation. A budget bucket Redis kept through the
fault (a network partition, a paused Redis) then lacks that spend, or holds a reservation the
usage record now holds too. Each such bucket is noted here with those tickets; once Redis answers
again and this process's usage records are in the database, the buckets are deleted and the
tickets dropped from their scopes' leases in one script (``QuotaStore.forget``): the next admission
rebuilds each bucket from the usage records, which hold every request once, whichever replica
served it, plus the leases in flight. No increment is replayed, so nothing is counted twice, also
where another replica rebuilt the bucket meanwhile. This process tries before each admission while
buckets are noted (a PING first: cheap while Redis is still away; not while the database fails
the flush) and every ``REPAIR_INTERVAL`` in the background, so the other replicas see the repair
within about that once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.background import stop_task
from gateway.contracts import Principal
from gateway.quotas.limits import LimitsSource, Scope, period_id
from gateway.quotas.store import Lease, QuotaStore

log = logging.getLogger("switchyard.quotas")

REPAIR_INTERVAL = 0.5  # seconds between the background's tries (Redis's recovery PINGs are as far apart)
BATCH = 500  # buckets or tickets per script call


@dataclass(frozen=True, slots=True)
class Uncounted:
    """The reservation of a ticket admitted without counting (``fail_open``): its scopes (None: the
    limits could not be read), when it was admitted, and the reservation Redis may have made after
    all (its answer was lost; None: none was asked for)."""

    scopes: list[Scope] | None
    at: float
    lease: Lease | None


class StaleBudgets:
    def __init__(self, store: QuotaStore, limits: LimitsSource,
                 flush_records: Callable[[], Awaitable[bool]] | None, *, lease_seconds: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.limits = limits
        self.flush_records = flush_records
        self.lease_seconds = lease_seconds
        self.clock = clock
        # each noted bucket (kind, id, budget period id) and ticket (its lease, to drop from its
        # scopes' leases; the number of its last note, and when) with the number of its last note:
        # one noted again during a repair stays
        self._buckets: dict[tuple[str, str, str], int] = {}
        self._tickets: dict[str, tuple[Lease, int, float]] = {}
        self._notes = 0
        # requests admitted while the limits could not be read: the hours they were admitted in
        # (budget periods begin on the hour) and the number of each hour's last note
        self._unresolved: dict[tuple[str, str | None], tuple[Principal, dict[float, int]]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failed = False  # the last try failed past the PING (the database): the background retries

    def __bool__(self) -> bool:
        return bool(self._buckets or self._tickets or self._unresolved)

    def uncounted(self, principal: Principal, ticket: Uncounted) -> None:
        """A request admitted without counting has settled (its usage record is on its way)."""
        self._note([(s.kind, s.id, period_id(s.limits.budget_period, ticket.at)[0]) for s in ticket.scopes or ()])
        if ticket.scopes is None:
            who = (principal.key_id, principal.tenant_id)
            self._unresolved.setdefault(who, (principal, {}))[1][ticket.at - ticket.at % 3600] = self._notes
        if ticket.lease is not None:
            self._ticket(ticket.lease)
        self._wake()

    def unsettled(self, lease: Lease) -> None:
        """A settlement Redis did not acknowledge (it may or may not have run)."""
        self._note(lease.scopes)
        self._ticket(lease)
        self._wake()

    def _ticket(self, lease: Lease) -> None:
        """Note ``lease`` to drop from its scopes' tickets, and forget the notes of leases that have
        ended by now: Redis drops an ended one itself before a rebuild counts it (so a long outage
        keeps at most a lease's worth of requests here)."""
        now = self.clock()
        self._tickets.pop(lease.ticket_id, None)
        self._tickets[lease.ticket_id] = (lease, self._notes, now)
        tickets, ended = self._tickets, now - self.lease_seconds - 1
        while (first := next(iter(tickets.values())))[2] < ended:
            del tickets[first[0].ticket_id]

    def _note(self, buckets: list[tuple[str, str, str]]) -> None:
        self._notes += 1
        for bucket in buckets:
            self._buckets[bucket] = self._notes

    def due(self) -> bool:
        """Something to repair before an admission: not while the database fails it (an admission
        does not wait for its timeouts; the background retries)."""
        return bool(self) and not self._failed

    async def repair(self) -> bool:
        """Delete the noted buckets and tickets once Redis answers and this process's usage records
        are in the database; True when nothing is left to repair. Never raises."""
        async with self._lock:
            if not self:
                return True
            try:
                if not await self.store.ready():
                    return False
            except Exception:  # still away
                return False
            upto = self._notes  # the notes whose usage records the flush below writes
            try:
                if self.flush_records is not None and not await self.flush_records():
                    raise ConnectionError("some usage records are not in the database yet")
                await self._resolve()
                buckets, tickets = list(self._buckets), [held[0] for held in self._tickets.values()]
                for i in range(0, max(len(buckets), len(tickets)), BATCH):
                    await self.store.forget(buckets[i : i + BATCH], tickets[i : i + BATCH])
            except Exception as exc:
                self._failed = True
                log.warning("budgets that missed spend while Redis was unavailable are not rebuilt yet (%s: %s)",
                            type(exc).__name__, exc)
                return False
            self._failed = False
            self._buckets = {bucket: n for bucket, n in self._buckets.items() if n > upto}
            self._tickets = {tid: held for tid, held in self._tickets.items() if held[1] > upto}
            log.info("%d budget buckets that missed spend while Redis was unavailable are deleted, to be rebuilt "
                     "from the usage records", len(buckets))
            return not self

    async def _resolve(self) -> None:
        """The buckets of requests admitted while the limits could not be read."""
        for who, (principal, hours) in list(self._unresolved.items()):
            scopes = await self.limits.scopes(principal)
            for at, note in hours.items():
                for bucket in [(s.kind, s.id, period_id(s.limits.budget_period, at)[0]) for s in scopes]:
                    self._buckets[bucket] = max(note, self._buckets.get(bucket, 0))
            del self._unresolved[who]

    def _wake(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="quota-stale-budgets")

    async def _run(self) -> None:
        while self:
            await asyncio.sleep(REPAIR_INTERVAL)
            await self.repair()

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
