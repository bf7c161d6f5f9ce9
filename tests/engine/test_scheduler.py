"""Scheduler behaviour with a stand-in for the model (each sampling step appends one token)."""

from __future__ import annotations

import pytest

from engine.block_manager import BlockManager
from engine.errors import RequestRejected
from engine.input_processor import RequestLimits
from engine.sampling_params import SamplingParams
from engine.scheduler import PriorityQueue, Scheduler, SchedulerOutput
from engine.sequence import FinishReason, Sequence

BS = 4


def make(num_blocks: int = 64, max_seqs: int = 8, budget: int = 32, max_len: int = 64, **kw) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), max_seqs, budget, max_len, **kw)


def add(s: Scheduler, rid: str, prompt_len: int, max_tokens: int, priority: int = 0) -> Sequence:
    """Prompts of different requests differ in their first token, so they share no blocks."""
    tokens = [len(rid) * 131 + sum(map(ord, rid))] + list(range(1, prompt_len))
    seq = Sequence(rid, tokens[:prompt_len], SamplingParams(max_tokens=max_tokens), priority=priority)
    seq.max_len = limits(s).max_len(prompt_len, max_tokens)  # what the input processor fixes on entry
    s.add(seq)
    return seq


def limits(s: Scheduler) -> RequestLimits:
    return RequestLimits(s.max_model_len, s.blocks.num_blocks, s.blocks.block_size)


def fake_step(s: Scheduler) -> SchedulerOutput:
    out = s.schedule()
    sampling = [item.seq for item in out.scheduled if item.samples]
    s.update_after_step(out)
    for seq in sampling:
        seq.append_token(7)
        if seq.num_output_tokens >= (seq.params.max_tokens or 0):
            s.finish(seq, FinishReason.LENGTH)
    return out


def run_all(s: Scheduler, limit: int = 1000) -> list[SchedulerOutput]:
    outs = []
    while s.num_unfinished and len(outs) < limit:
        outs.append(fake_step(s))
    assert not s.num_unfinished
    return outs


def test_token_budget_and_seq_cap_never_exceeded() -> None:
    s = make(max_seqs=3, budget=10)
    seqs = [add(s, f"r{i}", 5 + 3 * i, 4) for i in range(6)]
    for out in run_all(s):
        assert out.num_batched_tokens <= 10
        assert len(out.scheduled) <= 3
    assert all(q.num_output_tokens == 4 for q in seqs)
    assert s.blocks.num_free_blocks == 64


def test_decodes_come_before_prefills() -> None:
    s = make(budget=8)
    add(s, "a", 4, 5)
    fake_step(s)  # a prefilled, first token sampled
    add(s, "b", 20, 5)
    out = fake_step(s)
    assert out.scheduled[0].seq.request_id == "a" and out.scheduled[0].num_new_tokens == 1
    assert out.scheduled[1].num_new_tokens == 7  # b's prefill chunked into the rest of the budget


def test_chunked_prefill_splits_long_prompts() -> None:
    s = make(budget=8)
    seq = add(s, "long", 30, 2)
    chunks = []
    while seq.num_output_tokens == 0:
        out = fake_step(s)
        chunks.append(out.scheduled[0].num_new_tokens)
    assert chunks == [8, 8, 8, 6]


def test_finished_sequence_is_replaced_next_step() -> None:
    s = make(max_seqs=2, budget=64)
    short = add(s, "short", 4, 1)
    add(s, "long", 4, 10)
    waiting = add(s, "waiting", 4, 3)
    fake_step(s)
    assert short.is_finished and short.block_table == []
    out = fake_step(s)
    assert waiting in [item.seq for item in out.scheduled]
    run_all(s)


def test_over_long_requests_are_rejected() -> None:
    s = make(num_blocks=8, max_len=64)
    with pytest.raises(RequestRejected, match="context"):
        add(s, "x", 64, 1)
    with pytest.raises(RequestRejected, match="max_tokens") as over:
        add(s, "y", 40, 30)
    assert over.value.param == "max_tokens"
    with pytest.raises(RequestRejected, match="whole cache"):
        add(s, "z", 20, 20)  # 40 tokens need 10 blocks of 4; the cache has 8
    with pytest.raises(RequestRejected):
        add(s, "empty", 0, 1)
    assert s.num_unfinished == 0


def test_preemption_under_a_tiny_cache_completes_everything() -> None:
    s = make(num_blocks=10, max_seqs=8, budget=64, max_len=40)
    seqs = [add(s, f"r{i}", 6, 14) for i in range(4)]  # 4 x 5 blocks at the end > 10 blocks
    outs = run_all(s)
    assert s.num_preemptions > 0
    assert any(out.preempted for out in outs)
    assert all(q.num_output_tokens == 14 for q in seqs)
    assert s.blocks.num_free_blocks == 10
    first_victim = next(out.preempted[0] for out in outs if out.preempted)
    assert first_victim.request_id == "r3"  # newest first


def test_priority_policy_orders_admission_and_preemption() -> None:
    s = make(max_seqs=1, budget=64, policy=PriorityQueue())
    add(s, "low", 4, 2, priority=5)
    add(s, "high", 4, 2, priority=0)
    out = fake_step(s)
    assert out.scheduled[0].seq.request_id == "high"
    run_all(s)


def test_abort_frees_blocks_at_once() -> None:
    s = make()
    a = add(s, "a", 10, 20)
    fake_step(s)
    assert a.block_table
    s.finish(a, FinishReason.ABORT)
    assert s.blocks.num_free_blocks == 64 and not s.running
    b = add(s, "b", 10, 20)
    s.finish(b, FinishReason.ABORT)  # still waiting
    assert s.num_unfinished == 0


def test_without_chunked_prefill_prompts_wait_for_room() -> None:
    s = make(budget=16, max_len=16, enable_chunked_prefill=False)
    add(s, "a", 10, 2)
    add(s, "b", 10, 2)
    out = fake_step(s)
    assert [i.num_new_tokens for i in out.scheduled] == [10]
    run_all(s)


def test_prefix_hit_is_not_recomputed() -> None:
    s = make(budget=64)
    a = Sequence("a", list(range(1, 11)), SamplingParams(max_tokens=2))
    s.add(a)
    fake_step(s)
    b = Sequence("b", list(range(1, 11)) + [5], SamplingParams(max_tokens=2))
    s.add(b)
    out = fake_step(s)
    assert {i.seq.request_id: i.num_new_tokens for i in out.scheduled} == {"a": 1, "b": 3}
    assert b.num_cached_tokens == 8
    run_all(s)
    assert s.blocks.num_free_blocks == 64


def check_invariants(s: Scheduler) -> None:
    bm = s.blocks
    refs: dict[int, int] = {}
    for seq in s.running:
        assert len(seq.block_table) == bm.blocks_for(seq.num_computed_tokens) or seq.num_computed_tokens == 0
        for b in seq.block_table:
            refs[b] = refs.get(b, 0) + 1
    for block in bm.pool.blocks:
        assert block.ref_cnt == refs.get(block.block_id, 0)
    assert bm.num_free_blocks == bm.num_blocks - len(refs)
    for seq in s.waiting:
        assert seq.block_table == [] and seq.num_computed_tokens == 0


def test_random_workload_keeps_block_accounting_exact() -> None:
    import random

    rng = random.Random(0)
    s = make(num_blocks=24, max_seqs=6, budget=20, max_len=48)
    prefixes = [[rng.randrange(1, 50) for _ in range(12)] for _ in range(3)]
    live: list[Sequence] = []
    for step in range(400):
        if rng.random() < 0.4:
            tail = [rng.randrange(1, 50) for _ in range(rng.randint(0, 10))]
            tokens = rng.choice(prefixes)[: rng.randint(1, 12)] + tail
            seq = Sequence(f"q{step}", tokens, SamplingParams(max_tokens=rng.randint(1, 20)))
            s.add(seq)
            live.append(seq)
        if live and rng.random() < 0.05:
            victim = rng.choice(live)
            if not victim.is_finished:
                s.finish(victim, FinishReason.ABORT)
        out = fake_step(s)
        assert out.num_batched_tokens <= 20 and len(out.scheduled) <= 6
        check_invariants(s)
    run_all(s)
    check_invariants(s)
    assert s.blocks.num_free_blocks == 24
    assert s.blocks.prefix_hits > 0 and s.num_preemptions > 0


def test_prefix_cache_names_only_blocks_whose_kv_was_written() -> None:
    """Random workload with preemptions, aborts and failed steps (the model raised, so every
    request is aborted, as AsyncEngine does): each block the prefix cache can hand out holds the
    K/V of exactly its tokens, never a slot that was scheduled but not computed."""
    import random

    rng = random.Random(1)
    s = make(num_blocks=20, max_seqs=6, budget=16, max_len=48)
    pool = s.blocks.pool
    written: dict[int, dict[int, int]] = {}  # block -> offset -> token whose K/V the model wrote
    allocate = pool.allocate

    def allocate_fresh(n: int) -> list[int]:
        got = allocate(n)
        for b in got:
            written[b] = {}
        return got

    pool.allocate = allocate_fresh  # type: ignore[method-assign]
    prefixes = [[rng.randrange(1, 50) for _ in range(12)] for _ in range(3)]
    failed_steps = 0
    for step in range(400):
        if rng.random() < 0.4:
            tokens = rng.choice(prefixes)[: rng.randint(1, 12)] + [
                rng.randrange(1, 50) for _ in range(rng.randint(0, 8))
            ]
            s.add(Sequence(f"q{step}", tokens, SamplingParams(max_tokens=rng.randint(1, 16))))
        out = s.schedule()
        if out.scheduled and rng.random() < 0.1:  # the model raised before writing anything
            failed_steps += 1
            for seq in list(s.running) + list(s.waiting):
                s.finish(seq, FinishReason.ABORT)
        else:
            for item in out.scheduled:
                seq, start = item.seq, item.seq.num_computed_tokens
                for p in range(start, start + item.num_new_tokens):
                    written[seq.block_table[p // BS]][p % BS] = seq.token_ids[p]
            sampling = [item.seq for item in out.scheduled if item.samples]
            s.update_after_step(out)
            for seq in sampling:
                seq.append_token(rng.randrange(1, 50))
                if seq.num_output_tokens >= (seq.params.max_tokens or 0):
                    s.finish(seq, FinishReason.LENGTH)
        for block in pool._by_hash.values():
            got = tuple(written[block.block_id].get(i) for i in range(BS))
            assert got == block.token_ids, f"step {step}: cached block {block.block_id} was never computed"
    assert failed_steps and s.num_preemptions and s.blocks.prefix_hits


def test_preempted_request_counts_its_prefix_lookup_once() -> None:
    """prefix_queries / prefix_hits count each sequence's lookup at its first admission; a
    readmission after preemption (which finds its own cached blocks) does not inflate them."""
    s = make(num_blocks=10, max_seqs=8, budget=64, max_len=40)
    seqs = [add(s, f"r{i}", 6, 14) for i in range(4)]
    run_all(s)
    assert s.num_preemptions > 0
    assert s.blocks.prefix_queries == sum(q.num_prompt_tokens for q in seqs)
    assert s.blocks.prefix_hits == 0  # the prompts differ; readmissions are not looked up again
