"""Weighted fair queuing across tenants (virtual time over tokens scheduled).

Each tenant has a *virtual service*: the tokens the scheduler gave its sequences (prefill and
decode alike) divided by its weight. Admission takes the head of the tenant with the least
virtual service; preemption takes the newest running sequence of the tenant with the most. A
tenant that comes back from idle starts at the least virtual service of the tenants still
waiting, so idle time is not banked as credit. Within one tenant the order is first come,
first served, so with a single tenant this queue is exactly ``FCFSQueue``.
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


class FairQueue:
    """A ``QueuePolicy``: weighted fair admission and preemption across ``Sequence.tenant``."""

    def __init__(self) -> None:
        self._shares: dict[str, TenantShare] = {}
        self._len = 0

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
        return min(backlogged, key=lambda s: (s.virtual, s.waiting[0].arrival_time, s.waiting[0].seq_id))

    def peek(self) -> Sequence:
        return self._next().waiting[0]

    def pop(self) -> Sequence:
        self._len -= 1
        return self._next().waiting.popleft()

    def remove(self, seq: Sequence) -> None:
        self._shares[seq.tenant].waiting.remove(seq)
        self._len -= 1

    def pick_victim(self, running: list[Sequence]) -> Sequence:
        def over(s: Sequence) -> float:
            share = self._shares.get(s.tenant)
            return share.virtual if share is not None else 0.0

        return max(running, key=lambda s: (over(s), s.arrival_time, s.seq_id))

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
