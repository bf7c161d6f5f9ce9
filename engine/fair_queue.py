"""Weighted fair queuing across tenants (virtual time over tokens scheduled).

Each tenant has a *virtual service*: the tokens the scheduler gave its sequences (prefill and
decode alike) divided by its weight. Admission takes the head of the tenant with the least
virtual service (ties: the tenant admitted least recently, then the shorter backlog);
preemption takes the newest running sequence of the tenant with the most. A tenant that comes
back from idle starts at the least virtual service of the tenants still waiting, so idle time
is not banked as credit.

Two more rules keep a flood from setting everyone else's time to first token:

- **Slots.** When every ``max_num_seqs`` slot is taken and the waiting head's tenant holds fewer
  than its weighted share of them, the newest sequence of the tenant most over its share is
  preempted (by recompute; its computed blocks stay in the prefix cache) to make room.
- **First-token lane.** When the head is a new request of the least-served tenant and other
  tenants with more service have prefill work, that step carries the new request with the
  running decodes only; the others' prefill chunks wait one step. A tenant gets the lane only
  while its virtual service is at most the others', and the scheduler never grants two lane
  steps in a row, so a stream of new requests delays the others' prefill by one step at most.

Within one tenant the order is first come, first served, and with a single tenant neither rule
applies, so this queue is then exactly ``FCFSQueue``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.sequence import Sequence


@dataclass
class TenantShare:
    """One tenant's waiting sequences and the service it has had."""

    tenant: str
    weight: float = 1.0
    virtual: float = 0.0  # tokens scheduled / weight, with the catch-up on return from idle
    waiting: deque[Sequence] = field(default_factory=deque)
    last_admitted: int = 0  # the queue's admission count when this tenant last had a sequence popped


class FairQueue:
    """A ``QueuePolicy``: weighted fair admission and preemption across ``Sequence.tenant``."""

    def __init__(self) -> None:
        self._shares: dict[str, TenantShare] = {}
        self._len = 0
        self._admissions = 0

    def _share(self, seq: Sequence) -> TenantShare:
        share = self._shares.get(seq.tenant)
        if share is None:
            share = self._shares[seq.tenant] = TenantShare(seq.tenant)
        share.weight = seq.weight if seq.weight > 0 else 1.0
        return share

    def _system_virtual(self, exclude: TenantShare) -> float | None:
        backlogged = [s.virtual for s in self._shares.values() if s.waiting and s is not exclude]
        return min(backlogged) if backlogged else None

    def push(self, seq: Sequence) -> None:
        share = self._share(seq)
        if not share.waiting:
            floor = self._system_virtual(share)
            if floor is not None and share.virtual < floor:
                share.virtual = floor
        share.waiting.append(seq)
        self._len += 1

    def push_front(self, seq: Sequence) -> None:
        self._share(seq).waiting.appendleft(seq)
        self._len += 1

    def _next(self) -> TenantShare:
        backlogged = [s for s in self._shares.values() if s.waiting]
        if not backlogged:
            raise IndexError("the waiting queue is empty")
        return min(backlogged, key=lambda s: (s.virtual, s.last_admitted, len(s.waiting),
                                              s.waiting[0].arrival_time, s.waiting[0].seq_id))

    def peek(self) -> Sequence:
        return self._next().waiting[0]

    def pop(self) -> Sequence:
        self._len -= 1
        self._admissions += 1
        share = self._next()
        share.last_admitted = self._admissions
        return share.waiting.popleft()

    def remove(self, seq: Sequence) -> None:
        self._shares[seq.tenant].waiting.remove(seq)
        self._len -= 1

    def pick_victim(self, running: list[Sequence]) -> Sequence:
        def over(s: Sequence) -> float:
            share = self._shares.get(s.tenant)
            return share.virtual if share is not None else 0.0

        return max(running, key=lambda s: (over(s), s.arrival_time, s.seq_id))

    def slot_victim(self, head: Sequence, running: list[Sequence], max_num_seqs: int) -> Sequence | None:
        """The running sequence to preempt so ``head`` gets a slot, or None: only when ``head``'s
        tenant holds fewer than its weighted share of the slots and another holds more."""
        held: dict[str, int] = {}
        for seq in running:
            held[seq.tenant] = held.get(seq.tenant, 0) + 1
        active = set(held) | {t for t, share in self._shares.items() if share.waiting}
        weight = {t: self._shares[t].weight if t in self._shares else 1.0 for t in active}
        total = sum(weight.values())

        def share_of(tenant: str) -> float:
            return max_num_seqs * weight[tenant] / total

        if held.get(head.tenant, 0) + 1 > share_of(head.tenant):
            return None
        over = [t for t in held if t != head.tenant and held[t] > share_of(t)]
        if not over:
            return None
        tenant = max(over, key=lambda t: (held[t] / weight[t], self.virtual_service(t)))
        return max((s for s in running if s.tenant == tenant), key=lambda s: (s.arrival_time, s.seq_id))

    def first_token_lane(self, running: list[Sequence]) -> str | None:
        """The tenant whose new request this step carries alone with the decodes (see the module
        docstring), or None for an ordinary step."""
        if not self._len:
            return None
        share = self._next()
        if share.waiting[0].first_scheduled_time is not None:
            return None  # not a new request (a preempted one coming back)
        others = {s.tenant for s in running if s.is_prefilling} | {t for t, x in self._shares.items() if x.waiting}
        others.discard(share.tenant)
        if any(self._shares[t].virtual >= share.virtual for t in others if t in self._shares):
            return share.tenant
        return None

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """``num_tokens`` of ``seq`` were scheduled this step."""
        share = self._share(seq)
        share.virtual += num_tokens / share.weight

    def virtual_service(self, tenant: str) -> float:
        share = self._shares.get(tenant)
        return share.virtual if share is not None else 0.0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sequence]:
        for share in self._shares.values():
            yield from share.waiting
