"""Differential workloads on a seeded random Llama: random mixes of prompts on and around block
boundaries (1, 15-17, 31-33, 47-48 tokens), sharing a prefix, repeated (twice in one step, or
wholly cached on the second pass), greedy and seeded with n > 1, some with prompt logprobs, under
small KV pools (preemption mid-decode and mid-chunked-prefill), small token budgets and aborts at
random steps. Every request that is not aborted gives exactly what it gives alone on an unloaded
engine without a prefix cache, and every block is back in the pool afterwards."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)

VOCAB = 384
Key = tuple[list[list[int]], list[float | None]]


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def key(out: RequestOutput) -> Key:
    """Tokens exactly; prompt logprobs to float32 noise (chunking changes the summation order)."""
    scored = [round(t.logprob, 2) if t is not None else None for t in out.prompt_logprobs or []]
    return [c.token_ids for c in out.outputs], scored


def workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    shared = ids(48, 1000 + seed)
    requests: list[tuple[list[int], SamplingParams]] = []
    for i in range(rng.randint(3, 8)):
        length = rng.choice([1, 15, 16, 17, 31, 32, 33, 47, 48])
        prompt = (shared + ids(48, seed * 100 + i))[:length] if rng.random() < 0.7 else ids(length, seed * 100 + i)
        if requests and rng.random() < 0.2:
            prompt = list(rng.choice(requests)[0])
        common = dict(n=rng.choice([1, 2, 3]), max_tokens=rng.randint(1, 20),
                      prompt_logprobs=rng.choice([None, None, None, 1]))
        if rng.random() < 0.5:
            params = SamplingParams(temperature=0, **common)  # type: ignore[arg-type]
        else:
            params = SamplingParams(temperature=0.9, top_k=rng.choice([0, 20]), seed=rng.randrange(100),
                                    **common)  # type: ignore[arg-type]
        requests.append((prompt, params))
    return requests


@pytest.fixture(scope="module")
def solo(checkpoint) -> LLM:
    return LLM(str(checkpoint("llama")), num_kv_blocks=64, max_model_len=96, enable_prefix_caching=False)


@pytest.mark.parametrize("seed", range(4))
def test_loaded_cached_preempted_and_aborted_runs_equal_each_request_alone(checkpoint, solo: LLM, seed: int) -> None:
    rng = random.Random(seed)
    requests = workload(seed)
    alone = [key(solo.generate([p], sp)[0]) for p, sp in requests]
    budget = rng.choice([8, 16, 17, 33, 256])
    engine = LLMEngine(EngineConfig(
        model=str(checkpoint("llama")), num_kv_blocks=rng.choice([6, 7, 8]), max_model_len=96,
        max_num_batched_tokens=budget, max_num_seqs=min(budget, rng.choice([2, 3, 8])),
        enable_prefix_caching=rng.random() < 0.8, scheduling_policy=rng.choice(["fcfs", "priority", "fair"])))
    aborts = {i: rng.randint(0, 10) for i in range(len(requests)) if rng.random() < 0.2}
    for rep in range(2):  # the second pass meets what the first left in (or evicted from) the cache
        for i, (prompt, params) in enumerate(requests):
            engine.add_request(f"{rep}-{i}", prompt, params, tenant=rng.choice("ab"))
        done: dict[str, RequestOutput] = {}
        step = 0
        while engine.has_unfinished_requests():
            for i in (i for i, at in aborts.items() if at == step):
                engine.abort_request(f"{rep}-{i}")
            done.update((o.request_id, o) for o in engine.step() if o.finished)
            step += 1
            assert step < 2000, "no progress"
        got = {i: key(done[f"{rep}-{i}"]) for i in range(len(requests)) if i not in aborts}
        assert got == {i: alone[i] for i in got}
        blocks = engine.block_manager
        assert blocks.num_free_blocks == blocks.num_blocks and not blocks._chains
        assert all(b.ref_cnt == 0 for b in blocks.pool.blocks)
