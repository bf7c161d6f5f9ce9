"""Continuous-batching scheduler: which sequences run this step, with how many tokens.

Each step: running decodes first, then running (chunked) prefills, then new admissions from the
waiting queue, all within ``max_num_batched_tokens`` and ``max_num_seqs``. When the block pool
runs dry, the queue policy picks a victim (the newest, for FCFS) to preempt by recompute.
Every scheduled token is charged to the policy, which a fair policy uses to order tenants
(``engine.fair_queue.FairQueue``).
The waiting order and the victim choice live in a ``QueuePolicy`` so they can be swapped
(e.g. tenant-fair scheduling) without touching block accounting. A policy may also free a slot
for the waiting head when every slot is taken (``slot_victim``) and ask for a first-token step
that admits one tenant's new request beside the running decodes only (``first_token_lane``);
FCFS and priority never do either.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from engine.block_manager import BlockManager
from engine.sequence import FinishReason, Sequence, SequenceStatus


class QueuePolicy(Protocol):
    """The waiting queue: its order, and who is preempted when blocks run out."""

    def push(self, seq: Sequence) -> None: ...
    def push_front(self, seq: Sequence) -> None: ...
    def peek(self) -> Sequence: ...
    def pop(self) -> Sequence: ...
    def remove(self, seq: Sequence) -> None: ...
    def retire(self, seq: Sequence) -> None: ...
    def pick_victim(self, running: list[Sequence]) -> Sequence: ...
    def charge(self, seq: Sequence, num_tokens: int) -> None: ...
    def slot_victim(self, head: Sequence, running: list[Sequence], max_num_seqs: int) -> Sequence | None: ...
    def first_token_lane(self, running: list[Sequence]) -> str | None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Sequence]: ...


class _FixedOrder:
    """The hooks of a policy whose order is fixed when a sequence arrives (FCFS, priority)."""

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """Service is not tracked: the order depends on arrival (and priority) alone."""

    def retire(self, seq: Sequence) -> None:
        """Nor is the batch: a running sequence that ends changes no order."""

    def slot_victim(self, head: Sequence, running: list[Sequence], max_num_seqs: int) -> Sequence | None:
        """A full batch is never broken into for a waiting sequence."""
        return None

    def first_token_lane(self, running: list[Sequence]) -> str | None:
        return None


class FCFSQueue(_FixedOrder):
    """First come, first served; preempt the newest arrival."""

    def __init__(self) -> None:
        self._q: deque[Sequence] = deque()

    def push(self, seq: Sequence) -> None:
        self._q.append(seq)

    def push_front(self, seq: Sequence) -> None:
        self._q.appendleft(seq)

    def peek(self) -> Sequence:
        return self._q[0]

    def pop(self) -> Sequence:
        return self._q.popleft()

    def remove(self, seq: Sequence) -> None:
        self._q.remove(seq)

    def pick_victim(self, running: list[Sequence]) -> Sequence:
        return max(running, key=lambda s: (s.arrival_time, s.seq_id))

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)


class PriorityQueue(_FixedOrder):
    """Lower ``priority`` first, then arrival; preempt the lowest-priority newest."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, float, int]] = []
        self._seqs: list[Sequence] = []

    @staticmethod
    def _key(seq: Sequence) -> tuple[int, float, int]:
        return (seq.priority, seq.arrival_time, seq.seq_id)

    def push(self, seq: Sequence) -> None:
        key = self._key(seq)
        i = bisect.bisect(self._keys, key)
        self._keys.insert(i, key)
        self._seqs.insert(i, seq)

    push_front = push  # a preempted sequence keeps its key, so it sorts back to its place

    def peek(self) -> Sequence:
        return self._seqs[0]

    def pop(self) -> Sequence:
        self._keys.pop(0)
        return self._seqs.pop(0)

    def remove(self, seq: Sequence) -> None:
        i = self._seqs.index(seq)
        del self._keys[i], self._seqs[i]

    def pick_victim(self, running: list[Sequence]) -> Sequence:
        return max(running, key=self._key)

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._seqs)


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """This step reaches the sequence's last token, so its logits are sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    slot_preempted: list[Sequence] = field(default_factory=list)  # the part of ``preempted`` freed for a fair share

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        policy: QueuePolicy | None = None,
    ) -> None:
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: QueuePolicy = policy if policy is not None else FCFSQueue()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._lane_last_step = False  # the last step was a first-token step (see FairQueue)

    # -- admission and removal ----------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; its ``max_len`` was fixed by the input processor (engine.input_processor)."""
        seq.status = SequenceStatus.WAITING
        self.waiting.push(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Retire ``seq`` now (finished or aborted), freeing its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free(seq)
            self.waiting.retire(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

    # -- one step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        by_seq: dict[int, ScheduledSeq] = {}
        self._make_room(out)
        decodes = [s for s in self.running if not s.is_prefilling]
        prefills = [s for s in self.running if s.is_prefilling]
        budget = self._schedule_running(decodes, self.max_num_batched_tokens, by_seq, out)
        lane = self._first_token_lane(out)
        lane_admitted: set[int] = set()
        if lane is not None:
            # A tenant below its fair share has a request waiting for its first token: this step
            # carries it with the running decodes, and the other tenants' prefill chunks wait one
            # step, so its time to first token is not one of their long prefill steps.
            running_ids = set(by_seq)
            budget = self._admit(budget, by_seq, out, only=lane)
            lane_admitted = set(by_seq) - running_ids
            if lane_admitted:
                prefills = [s for s in prefills if s.tenant == lane]
            else:
                lane = None  # its request could not be admitted: an ordinary step
        self._lane_last_step = lane is not None  # never two in a row: others' prefill waits one step at most
        budget = self._schedule_running(prefills, budget, by_seq, out)
        for seq_id, item in by_seq.items():  # the running sequences' service (admissions charge as they go)
            if seq_id not in lane_admitted:
                self.waiting.charge(item.seq, item.num_new_tokens)
        if lane is None and not self._blocks_ran_out(out):
            self._admit(budget, by_seq, out)
        out.scheduled = list(by_seq.values())
        return out

    def _first_token_lane(self, out: SchedulerOutput) -> str | None:
        if self._lane_last_step or self._blocks_ran_out(out):
            return None
        return self.waiting.first_token_lane(self.running)

    def _schedule_running(self, seqs: list[Sequence], budget: int, by_seq: dict[int, ScheduledSeq],
                          out: SchedulerOutput) -> int:
        """Schedule running sequences in order within ``budget``, preempting when blocks run out."""
        for seq in seqs:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this step
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.blocks.allocate(seq, num_new):
                victim = self.waiting.pick_victim(self.running)
                budget += self._preempt(victim, by_seq, out)
                if victim is seq:
                    break
            else:
                by_seq[seq.seq_id] = ScheduledSeq(seq, num_new)
                budget -= num_new
        return budget

    @staticmethod
    def _blocks_ran_out(out: SchedulerOutput) -> bool:
        """This step preempted for blocks (not for a fair share of slots): admit nothing more."""
        return len(out.preempted) > len(out.slot_preempted)

    def _make_room(self, out: SchedulerOutput) -> None:
        """With every slot taken, the queue policy may free one for the waiting head (a fair
        policy does when the head's tenant holds less than its share of ``max_num_seqs``)."""
        while self.waiting and len(self.running) >= self.max_num_seqs:
            victim = self.waiting.slot_victim(self.waiting.peek(), self.running, self.max_num_seqs)
            if victim is None:
                return
            self._preempt(victim, {}, out)
            out.slot_preempted.append(victim)

    def _preempt(self, seq: Sequence, by_seq: dict[int, ScheduledSeq], out: SchedulerOutput) -> int:
        """Free ``seq``'s blocks and requeue it at the front; return budget it gave back."""
        given_back = by_seq.pop(seq.seq_id).num_new_tokens if seq.seq_id in by_seq else 0
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push_front(seq)
        out.preempted.append(seq)
        return given_back

    def _sibling_prefilling(self, seq: Sequence) -> bool:
        """A sibling (same request, n > 1) is still computing the shared prompt: wait for it
        so this sequence can take the prompt's blocks from the cache instead of recomputing
        (asked only while the cache lacks some of them: siblings that find every full block
        there are admitted together, not one a step)."""
        return any(
            s.request_id == seq.request_id and s.num_computed_tokens < s.num_prompt_tokens
            for s in self.running
        )

    def _admit(self, budget: int, by_seq: dict[int, ScheduledSeq], out: SchedulerOutput,
               only: str | None = None) -> int:
        """Admit from the head of the waiting queue (only ``only``'s sequences, when given)."""
        bs = self.blocks.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.peek()
            if only is not None and seq.tenant != only:
                break
            cached = self.blocks.find_cached_prefix(seq)
            if (seq.num_preemptions == 0 and len(cached) < (seq.num_tokens - 1) // bs
                    and self._sibling_prefilling(seq)):
                break
            remaining = seq.num_tokens - len(cached) * bs
            num_new = min(remaining, budget)
            if num_new < remaining and not self.enable_chunked_prefill:
                break
            if not self.blocks.allocate(seq, num_new, cached):
                break
            self.waiting.pop()
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = len(cached) * bs
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            by_seq[seq.seq_id] = ScheduledSeq(seq, num_new)
            self.waiting.charge(seq, num_new)
            budget -= num_new
        return budget

    def update_after_step(self, out: SchedulerOutput) -> None:
        """The model wrote this step's tokens into the cache: they count as computed, and the
        blocks they filled become prefix-cache hits (never before: see ``BlockManager``)."""
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.blocks.cache_computed_blocks(item.seq)
