"""Weighted fair queuing across tenants (virtual time over tokens scheduled).

Each tenant has a *virtual service*: the tokens the scheduler gave its sequences (prefill and
decode alike) divided by its weight. Admission takes the head of the tenant with the least
virtual service (ties: the tenant admitted least recently, then the shorter backlog);
preemption takes the newest running sequence of the tenant with the most. A tenant that comes
back from idle, or comes for the first time, starts at the queue's *virtual time*: the least
virtual service of the tenants waiting or served, which never goes back (also while nobody
waits); so idle time is not banked as credit.

The queue remembers a tenant only while that says more than its virtual time would: one neither
waiting, nor served since the last sweep, nor above the queue's virtual time (a newcomer would
start where it stands) is forgotten at the next sweep, once the tenants it knows have doubled
since the last (a gateway meets millions of tenants; each step looks at the waiting ones only).

Two more rules keep a flood from setting everyone else's time to first token:

- **Slots.** When every ``max_num_seqs`` slot is taken and the waiting head's tenant holds fewer
  than its weighted share of them, the newest sequence of the tenant most over its share is
  preempted (by recompute; its computed blocks stay in the prefix cache) to make room.
- **First-token lane.** When the head is a new request of the least-served tenant and other
  tenants with more service have prefill work, that step carries the new request with the
  running decodes only; the others' prefill chunks wait one step. A tenant gets the lane only
  while its virtual service is at most the others', and the scheduler never grants two lane
  steps in a row, so a stream of new requests delays the others' prefill by one step at most.

Within one tenant the slots it holds are shared between its requests (a request with ``n`` > 1 has
``n`` sequences): the waiting sequence admitted first is that of the request with the fewest
sequences running (ties: first come, first served); when every slot is taken, a waiting request
takes one from the tenant's request holding at least two more (its newest sequence is preempted),
and when blocks run out the tenant's request holding the most gives one up. So a small request is
not starved by an ``n = 128`` one of the same key: it gets a slot the next step. With requests of
one sequence each neither rule applies, so with a single tenant this queue is then exactly
``FCFSQueue``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.sequence import Sequence

SWEEP_MIN = 64  # tenants known before the queue first sweeps the idle ones out


@dataclass
class TenantShare:
    """One tenant's waiting sequences (by request) and the service it has had."""

    tenant: str
    weight: float = 1.0
    virtual: float = 0.0  # tokens scheduled / weight, from the queue's virtual time when first seen
    # request id -> its waiting sequences; requests in arrival order (a preempted one goes first)
    waiting: OrderedDict[str, deque[Sequence]] = field(default_factory=OrderedDict)
    running: dict[str, int] = field(default_factory=dict)  # request id -> its sequences in the batch
    num_waiting: int = 0
    last_admitted: int = 0  # the queue's admission count when this tenant last had a sequence popped
    served: bool = False  # charged since the last sweep (it has, or had, a sequence running)

    def head(self) -> Sequence:
        """The next sequence: of the waiting request with the fewest running, the first to come.
        Requests with some running stand before the first with none only while partly admitted
        (n > 1), so this looks at no more of them than there are slots."""
        best: deque[Sequence] | None = None
        fewest = 0
        for request_id, seqs in self.waiting.items():
            held = self.running.get(request_id, 0)
            if held == 0:
                return seqs[0]
            if best is None or held < fewest:
                best, fewest = seqs, held
        if best is None:
            raise IndexError("the tenant has nothing waiting")
        return best[0]

    def add(self, seq: Sequence, front: bool = False) -> None:
        seqs = self.waiting.get(seq.request_id)
        if seqs is None:
            seqs = self.waiting[seq.request_id] = deque()
        if front:
            seqs.appendleft(seq)
            self.waiting.move_to_end(seq.request_id, last=False)
        else:
            seqs.append(seq)
        self.num_waiting += 1

    def discard(self, seq: Sequence) -> None:
        """Take ``seq`` out of the waiting sequences."""
        seqs = self.waiting[seq.request_id]
        seqs.remove(seq)
        if not seqs:
            del self.waiting[seq.request_id]
        self.num_waiting -= 1

    def release(self, seq: Sequence) -> None:
        """``seq`` left the batch (preempted, finished or aborted)."""
        held = self.running.get(seq.request_id, 0) - 1
        if held > 0:
            self.running[seq.request_id] = held
        else:
            self.running.pop(seq.request_id, None)


class FairQueue:
    """A ``QueuePolicy``: weighted fair admission and preemption across ``Sequence.tenant``."""

    def __init__(self) -> None:
        self._shares: dict[str, TenantShare] = {}  # the tenants remembered (see the module docstring)
        self._backlogged: dict[str, TenantShare] = {}  # those with sequences waiting
        self._vtime = 0.0  # the queue's virtual time: where a tenant starts; never goes back
        self._sweep_at = SWEEP_MIN
        self._len = 0
        self._admissions = 0

    def _share(self, seq: Sequence) -> TenantShare:
        share = self._shares.get(seq.tenant)
        if share is None:
            if len(self._shares) >= self._sweep_at:
                self._sweep()
            share = self._shares[seq.tenant] = TenantShare(seq.tenant, virtual=self._vtime)
        share.weight = seq.weight if seq.weight > 0 else 1.0
        return share

    def _sweep(self) -> None:
        """Advance the virtual time to the least service of the tenants waiting or served since the
        last sweep, and forget the idle ones at or below it (each stands where a newcomer would; one
        served since is kept: it may still run, and its service decides who is preempted)."""
        active = [s.virtual for s in self._shares.values() if s.num_waiting or s.served]
        self._vtime = max(self._vtime, min(active, default=self._vtime))
        self._shares = {t: s for t, s in self._shares.items() if s.num_waiting or s.served or s.virtual > self._vtime}
        for share in self._shares.values():
            share.served = False
        self._sweep_at = max(SWEEP_MIN, 2 * len(self._shares))

    def push(self, seq: Sequence) -> None:
        share = self._share(seq)
        if not share.num_waiting:
            floor = min((s.virtual for s in self._backlogged.values()), default=self._vtime)
            self._vtime = max(self._vtime, floor)
            share.virtual = max(share.virtual, self._vtime)
            self._backlogged[share.tenant] = share
        share.add(seq)
        self._len += 1

    def push_front(self, seq: Sequence) -> None:
        """A running sequence preempted: it leaves the batch and waits first of its tenant's."""
        share = self._share(seq)
        share.release(seq)
        share.add(seq, front=True)
        self._backlogged[share.tenant] = share
        self._len += 1

    def _next(self) -> TenantShare:
        if not self._backlogged:
            raise IndexError("the waiting queue is empty")
        def key(s: TenantShare) -> tuple[float, int, int, float, int]:
            head = s.head()
            return (s.virtual, s.last_admitted, s.num_waiting, head.arrival_time, head.seq_id)

        return min(self._backlogged.values(), key=key)

    def peek(self) -> Sequence:
        return self._next().head()

    def pop(self) -> Sequence:
        share = self._next()
        self._len -= 1
        self._admissions += 1
        self._vtime = max(self._vtime, share.virtual)  # the least of the waiting
        share.last_admitted = self._admissions
        seq = share.head()
        share.discard(seq)
        share.running[seq.request_id] = share.running.get(seq.request_id, 0) + 1
        if not share.num_waiting:
            del self._backlogged[share.tenant]
        return seq

    def remove(self, seq: Sequence) -> None:
        share = self._shares[seq.tenant]
        share.discard(seq)
        if not share.num_waiting:
            del self._backlogged[share.tenant]
        self._len -= 1

    def retire(self, seq: Sequence) -> None:
        """A running ``seq`` finished or was aborted."""
        share = self._shares.get(seq.tenant)
        if share is not None:  # (a tenant forgotten while running has lost its counts: no matter)
            share.release(seq)

    def _held(self, seq: Sequence) -> int:
        """Sequences of ``seq``'s request in the batch."""
        share = self._shares.get(seq.tenant)
        return share.running.get(seq.request_id, 0) if share is not None else 0

    def pick_victim(self, running: list[Sequence]) -> Sequence:
        """The newest sequence of the request holding the most slots, of the tenant most served."""
        return max(running, key=lambda s: (self.virtual_service(s.tenant), self._held(s), s.arrival_time, s.seq_id))

    def slot_victim(self, head: Sequence, running: list[Sequence], max_num_seqs: int) -> Sequence | None:
        """The running sequence to preempt so ``head`` gets a slot, or None: when ``head``'s tenant
        holds fewer than its weighted share of the slots and another holds more, the newest sequence
        of that tenant's biggest request; else one of ``head``'s tenant's own (``_request_victim``)."""
        held: dict[str, int] = {}
        for seq in running:
            held[seq.tenant] = held.get(seq.tenant, 0) + 1
        active = set(held) | set(self._backlogged)
        weight = {t: self._shares[t].weight if t in self._shares else 1.0 for t in active}
        total = sum(weight.values())

        def share_of(tenant: str) -> float:
            return max_num_seqs * weight[tenant] / total

        if held.get(head.tenant, 0) + 1 > share_of(head.tenant):
            return self._request_victim(head, running)
        over = [t for t in held if t != head.tenant and held[t] > share_of(t)]
        if not over:
            return self._request_victim(head, running)
        tenant = max(over, key=lambda t: (held[t] / weight[t], self.virtual_service(t)))
        return max((s for s in running if s.tenant == tenant), key=lambda s: (self._held(s), s.arrival_time, s.seq_id))

    def _request_victim(self, head: Sequence, running: list[Sequence]) -> Sequence | None:
        """The newest sequence of the request of ``head``'s tenant that holds the most slots, when
        it holds at least two more than ``head``'s request (so the move evens them out), else None."""
        share = self._shares.get(head.tenant)
        if share is None:
            return None
        counts = share.running
        mine = counts.get(head.request_id, 0)
        biggest = max((r for r in counts if r != head.request_id), key=counts.__getitem__, default=None)
        if biggest is None or counts[biggest] < mine + 2:
            return None
        return max((s for s in running if s.tenant == head.tenant and s.request_id == biggest),
                   key=lambda s: (s.arrival_time, s.seq_id))

    def first_token_lane(self, running: list[Sequence]) -> str | None:
        """The tenant whose new request this step carries alone with the decodes (see the module
        docstring), or None for an ordinary step."""
        if not self._len:
            return None
        share = self._next()
        if share.head().first_scheduled_time is not None:
            return None  # not a new request (a preempted one coming back)
        others = {s.tenant for s in running if s.is_prefilling} | set(self._backlogged)
        others.discard(share.tenant)
        if any(self.virtual_service(t) >= share.virtual for t in others):
            return share.tenant
        return None

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """``num_tokens`` of ``seq`` were scheduled this step."""
        share = self._share(seq)
        share.virtual += num_tokens / share.weight
        share.served = True

    def virtual_service(self, tenant: str) -> float:
        """The tenant's virtual service (one the queue does not remember: the queue's virtual time,
        where it would start)."""
        share = self._shares.get(tenant)
        return share.virtual if share is not None else self._vtime

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sequence]:
        for share in self._backlogged.values():
            for seqs in share.waiting.values():
                yield from seqs
