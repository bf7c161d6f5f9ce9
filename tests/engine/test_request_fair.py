"""Fairness between the requests of one tenant (``FairQueue``): a request with n = 128 sequences
must not hold every slot while a small request of the same tenant waits for its first token.

The bound under test: with every slot held by one request, a new request of the same tenant is
scheduled in the step after it arrives (a slot is freed by preempting the newest sequence of the
request holding the most), while the big request is still running; the big request still
finishes every sequence, with the tokens it gives when it runs alone.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.fair_queue import FairQueue
from engine.scheduler import FCFSQueue, QueuePolicy, Scheduler
from engine.sequence import Sequence
from tests.engine.test_scheduler import fake_step as tick  # one step of the stand-in model

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)
from .test_engine_api import assert_no_leak, ids

BS = 16
N, MAX_TOKENS = 128, 2000


def make(policy: QueuePolicy, max_seqs: int = N, num_blocks: int = N * (MAX_TOKENS // BS + 2) + 8) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), max_seqs, 512, 4096, policy=policy)


def add(s: Scheduler, rid: str, n: int, prompt_len: int, max_tokens: int, tenant: str = "A") -> list[Sequence]:
    """A request of ``n`` sequences (its siblings share the prompt, as the engine makes them)."""
    tokens = [sum(map(ord, rid)) * 7 + len(rid)] + list(range(1, prompt_len))
    seqs = [Sequence(rid, tokens, SamplingParams(max_tokens=max_tokens, n=n), index=i, arrival_time=0.0,
                     max_len=prompt_len + max_tokens) for i in range(n)]
    for seq in seqs:
        seq.tenant = tenant
        s.add(seq)
    return seqs


def wait_for_first_token(policy: QueuePolicy, max_seqs: int = N, num_blocks: int | None = None,
                         small_tokens: int = 4) -> tuple[int, Scheduler, list[Sequence], Sequence]:
    """The n = 128 request runs for 20 steps, then a small request of the same tenant arrives:
    return the steps until its first token, the scheduler, the big request's sequences, the small one."""
    s = make(policy, max_seqs) if num_blocks is None else make(policy, max_seqs, num_blocks)
    big = add(s, "big", N, 40, MAX_TOKENS)
    for _ in range(20):
        tick(s)
    assert sum(q.request_id == "big" for q in s.running) == min(N, max_seqs)
    (small,) = add(s, "small", 1, 8, small_tokens)
    steps = 0
    while small.num_output_tokens == 0 and steps < 3 * MAX_TOKENS:
        tick(s)
        steps += 1
    return steps, s, big, small


@pytest.mark.parametrize("max_seqs", [N, 32])  # the big request fills the batch; or overflows it
def test_a_small_request_is_not_starved_by_a_big_one_of_the_same_tenant(max_seqs: int) -> None:
    steps, s, big, small = wait_for_first_token(FairQueue(), max_seqs)
    assert steps <= 2, steps  # was ~2000: the small request waited for the big one's slots
    assert all(q.num_output_tokens < MAX_TOKENS for q in big)  # the big request is still running
    assert len(s.running) <= max_seqs
    while not small.is_finished:
        tick(s)
    assert small.num_output_tokens == 4
    assert all(not q.is_finished for q in big)  # done before the big request's first sequence ends
    while s.num_unfinished:
        tick(s)
    assert all(q.num_output_tokens == MAX_TOKENS for q in big)
    assert s.blocks.num_free_blocks == s.blocks.num_blocks


def test_fcfs_still_makes_the_small_request_wait_behind_the_big_one() -> None:
    steps, *_ = wait_for_first_token(FCFSQueue())
    assert steps > MAX_TOKENS - 40  # first come, first served: behind all 128 sequences


def test_when_blocks_run_out_the_big_request_gives_them_up_not_the_small_one() -> None:
    """The cache holds the 128 sequences' first 64 tokens, not all their outputs: the big
    request's own sequences are preempted as it grows, never the small request of its tenant."""
    steps, s, big, small = wait_for_first_token(FairQueue(), num_blocks=N * 3 + 8, small_tokens=200)
    assert steps <= 2, steps
    for_blocks = 0
    while not small.is_finished:
        out = tick(s)
        for_blocks += len(out.preempted) - len(out.slot_preempted)
    assert for_blocks > 0 and small.num_preemptions == 0
    while s.num_unfinished:
        tick(s)
    assert all(q.num_output_tokens == MAX_TOKENS for q in big)


def test_the_slots_of_one_tenant_are_spread_evenly_over_its_requests() -> None:
    s = make(FairQueue(), max_seqs=32)
    add(s, "big", N, 40, MAX_TOKENS)
    for _ in range(5):
        tick(s)
    add(s, "mid", 16, 24, MAX_TOKENS)
    for _ in range(40):
        tick(s)
    held = {rid: sum(q.request_id == rid for q in s.running) for rid in ("big", "mid")}
    assert held == {"big": 16, "mid": 16}, held


def test_a_big_request_of_another_tenant_gives_up_slots_before_its_small_ones() -> None:
    s = make(FairQueue(), max_seqs=32)
    add(s, "big", N, 40, MAX_TOKENS, tenant="A")
    for _ in range(5):
        tick(s)
    (a_small,) = add(s, "a-small", 1, 8, 100, tenant="A")
    tick(s)
    tick(s)
    assert a_small.num_output_tokens > 0
    (b,) = add(s, "b", 1, 8, 4, tenant="B")
    out = tick(s)
    assert [p.request_id for p in out.slot_preempted] == ["big"]  # not A's newest, the small request
    assert b in [x.seq for x in out.scheduled] and a_small.status.value == "running"


def test_engine_n_128_request_does_not_starve_a_small_one_and_keeps_its_tokens(checkpoint) -> None:
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=1024, max_model_len=256, max_num_seqs=N,
              scheduling_policy="fair")
    eng = llm.engine
    prompt, params = ids(24, 90), SamplingParams(n=N, temperature=0.8, seed=17, max_tokens=24)
    small_prompt, greedy = ids(9, 91), SamplingParams(temperature=0, max_tokens=5)
    alone = [o.token_ids for o in llm.generate([prompt], params)[0].outputs]
    small_alone = llm.generate([small_prompt], greedy)[0].outputs[0].token_ids
    assert len({tuple(t) for t in alone}) > 1  # seeded sampling: the sequences differ

    eng.add_request("big", prompt, params, tenant="t")
    for _ in range(4):
        eng.step()
    eng.add_request("small", small_prompt, greedy, tenant="t")
    finals, steps, first_token_step = {}, 0, None
    while eng.has_unfinished_requests():
        steps += 1
        for o in eng.step():
            if o.request_id == "small" and first_token_step is None and o.outputs[0].token_ids:
                first_token_step = steps
                assert "big" not in finals  # the big request is still running
            if o.finished:
                finals[o.request_id] = o
    assert first_token_step is not None and first_token_step <= 2, first_token_step
    assert finals["small"].outputs[0].token_ids == small_alone
    assert [o.token_ids for o in finals["big"].outputs] == alone
    assert eng.scheduler.num_preemptions > 0  # a sibling of the big request gave its slot up
    assert_no_leak(llm)
