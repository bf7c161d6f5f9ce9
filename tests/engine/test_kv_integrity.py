"""Property test of the scheduler and block manager against a simulated KV cache: every slot a
step writes holds (token, position) of its sequence, and every step's context reads back exactly
its own tokens, whatever the prefix cache shares, preemption recomputes, chunking splits, aborts
free or n > 1 siblings hold in common. Model-free, so it runs thousands of workloads in seconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_manager import BlockManager
from engine.fair_queue import FairQueue
from engine.input_processor import RequestLimits
from engine.sampling_params import SamplingParams
from engine.scheduler import FCFSQueue, PriorityQueue, Scheduler
from engine.sequence import FinishReason, Sequence

BS = 4
MAX_LEN = 24
PREFIX = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # three blocks shared by some prompts

request = st.tuples(
    st.integers(1, MAX_LEN - 1),  # prompt length (on and off block boundaries)
    st.booleans(),  # starts with the shared prefix
    st.integers(1, 8),  # max_tokens
    st.integers(1, 3),  # n
    st.integers(0, 2),  # priority
    st.sampled_from("ab"),  # tenant
)


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(request, min_size=1, max_size=8),
    num_blocks=st.integers(MAX_LEN // BS, 16),
    max_seqs=st.integers(1, 4),
    extra_budget=st.sampled_from([0, 1, 3, 9, 40]),
    caching=st.booleans(),
    policy=st.sampled_from([FCFSQueue, PriorityQueue, FairQueue]),
    aborts=st.lists(st.integers(0, 60), max_size=3),
)
def test_every_step_reads_back_exactly_its_own_tokens(requests, num_blocks, max_seqs, extra_budget,
                                                     caching, policy, aborts) -> None:
    blocks = BlockManager(num_blocks, BS, enable_caching=caching)
    s = Scheduler(blocks, max_seqs, max_seqs + extra_budget, MAX_LEN, policy=policy())
    limits = RequestLimits(MAX_LEN, num_blocks, BS)
    by_request: dict[str, list[Sequence]] = {}
    for i, (length, shared, max_tokens, n, priority, tenant) in enumerate(requests):
        prompt = (PREFIX + [200 + i] * MAX_LEN if shared else [100 + i] * MAX_LEN)[:length]
        max_tokens = min(max_tokens, MAX_LEN - length)
        params = SamplingParams(max_tokens=max_tokens, n=n)
        rid = f"r{i}"
        by_request[rid] = []
        for j in range(n):
            seq = Sequence(rid, prompt, params, index=j, priority=priority)
            seq.max_len = limits.max_len(length, max_tokens)
            seq.cache_salt = 0 if caching else (hash(rid) | 1)
            seq.tenant = tenant
            s.add(seq)
            by_request[rid].append(seq)
    kv: dict[int, tuple[int, int]] = {}  # slot -> (token, position) written there
    step = 0
    while s.num_unfinished:
        step += 1
        assert step < 2000, "no progress"
        if step in aborts:
            live = [seqs for seqs in by_request.values() if not all(q.is_finished for q in seqs)]
            for seq in live[0] if live else []:  # the oldest unfinished request, wherever it is
                if not seq.is_finished:
                    s.finish(seq, FinishReason.ABORT)
            continue
        out = s.schedule()
        assert out.scheduled or not s.num_unfinished
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            for p in range(start, start + item.num_new_tokens):
                block = blocks.pool.blocks[seq.block_table[p // BS]]
                assert block.ref_cnt == 1 and not block.cache_id, "a write into a shared or cached block"
                kv[block.block_id * BS + p % BS] = (seq.token_ids[p], p)
        for item in out.scheduled:  # attention reads the whole context through the block table
            seq = item.seq
            for p in range(seq.num_computed_tokens + item.num_new_tokens):
                assert kv.get(seq.block_table[p // BS] * BS + p % BS) == (seq.token_ids[p], p)
        s.update_after_step(out)
        for item in out.scheduled:
            seq = item.seq
            if item.samples:
                seq.append_token(1000 + seq.index * 50 + seq.num_output_tokens)  # siblings diverge
                if seq.num_tokens >= seq.max_len:
                    s.finish(seq, FinishReason.LENGTH)
    assert blocks.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in blocks.pool.blocks) and not blocks._chains
    for b in blocks.pool.blocks:  # what the cache names is what the slots hold
        if b.cache_id:
            assert [kv[b.block_id * BS + k][0] for k in range(BS)] == list(b.token_ids)
    if not caching:
        assert blocks.pool.num_cached == 0
