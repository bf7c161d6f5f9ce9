"""LLM / LLMEngine behaviour on a seeded random Llama: prefix cache, n > 1, seeds, stops, aborts,
rejections, startup sizing errors, metrics."""

from __future__ import annotations

import random

import pytest

from engine import LLM, PoolingParams, RequestRejected, SamplingParams
from engine.model_runner import StepResult
from engine.outputs import RequestOutput
from engine.scheduler import ScheduledSeq
from engine.sequence import FinishReason, Sequence

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)

VOCAB = 384


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


@pytest.fixture(scope="module")
def llm(checkpoint) -> LLM:
    return LLM(str(checkpoint("llama")), block_size=8, num_kv_blocks=128, max_model_len=256)


def assert_no_leak(llm: LLM) -> None:
    bm = llm.engine.block_manager
    assert not llm.engine.has_unfinished_requests()
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_cnt == 0 for b in bm.pool.blocks)


GREEDY = SamplingParams(temperature=0, max_tokens=10)


def test_prefix_hits_reuse_blocks_and_give_identical_output(llm: LLM) -> None:
    shared = ids(40, 1)
    prompts = [shared + ids(5, 2), shared + ids(7, 3)]
    first = llm.generate(prompts, GREEDY)
    hits_before = llm.engine.block_manager.prefix_hits
    again = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    assert all(o.num_cached_tokens >= 40 for o in again)
    assert llm.engine.block_manager.prefix_hits - hits_before >= 80
    assert_no_leak(llm)


def test_prefix_caching_off_gives_the_same_tokens(llm: LLM, checkpoint) -> None:
    prompts = [ids(30, 4), ids(30, 4) + ids(3, 5)]
    off = LLM(str(checkpoint("llama")), block_size=8, num_kv_blocks=128, max_model_len=256,
              enable_prefix_caching=False)
    a = llm.generate(prompts, GREEDY)
    b = off.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(o.num_cached_tokens == 0 for o in b)


def test_n_samples_share_the_prompt_blocks(llm: LLM) -> None:
    prompt = ids(41, 6)
    hits_before = llm.engine.block_manager.prefix_hits
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8)
    out = llm.generate([prompt], params)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    assert llm.engine.block_manager.prefix_hits - hits_before >= 2 * 40  # siblings reuse 5 blocks
    again = llm.generate([prompt], params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]
    assert_no_leak(llm)


def test_seeded_request_is_reproducible_whatever_its_batch_mates(llm: LLM) -> None:
    target = ids(20, 7)
    params = SamplingParams(temperature=0.9, top_k=50, seed=1234, max_tokens=12)
    alone = llm.generate([target], params)[0].outputs[0].token_ids
    mates = [ids(n, 8 + n) for n in (5, 33, 17)]
    batch = llm.generate(
        mates[:2] + [target] + mates[2:],
        [SamplingParams(temperature=1.0, max_tokens=20)] * 2 + [params] + [GREEDY],
    )
    assert batch[2].outputs[0].token_ids == alone


def test_an_integer_temperature_samples_as_its_float(llm: LLM) -> None:
    """``temperature=1`` (an int) failed every request of a step whose sampled rows all had int
    temperatures (finish_reason "error", no tokens); it samples as ``1.0`` does."""
    prompt = ids(15, 60)
    as_int = llm.generate([prompt, prompt], [SamplingParams(temperature=t, seed=8, max_tokens=8) for t in (1, 2)])
    as_float = llm.generate([prompt, prompt], [SamplingParams(temperature=t, seed=8, max_tokens=8) for t in (1.0, 2.0)])
    assert [o.outputs[0].finish_reason for o in as_int] == ["length", "length"]
    assert [o.outputs[0].token_ids for o in as_int] == [o.outputs[0].token_ids for o in as_float]


def test_stop_token_ids_min_tokens_and_max_tokens(llm: LLM) -> None:
    prompt = ids(12, 9)
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10))[0].outputs[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    stop_tok = free.token_ids[3]
    k = free.token_ids.index(stop_tok)
    stopped = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_tok]))
    out = stopped[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    assert out.token_ids == free.token_ids[: k + 1]
    held = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=10, min_tokens=10, stop_token_ids=[stop_tok])
    )[0].outputs[0]
    assert len(held.token_ids) == 10 and stop_tok not in held.token_ids  # banned before min_tokens


def test_eos_ends_a_sequence_without_a_stop_reason_even_when_listed_in_stop_token_ids(llm: LLM) -> None:
    """As vLLM: the EOS check comes first, so ``stop_reason`` stays None for EOS."""
    prompt = ids(12, 9)
    eos = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10))[0].outputs[0].token_ids[3]
    saved = llm.engine.eos_token_ids
    llm.engine.eos_token_ids = {eos}
    try:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[eos]))[0].outputs[0]
    finally:
        llm.engine.eos_token_ids = saved
    assert out.finish_reason == "stop" and out.stop_reason is None


def test_over_long_requests_are_rejected_clearly(llm: LLM) -> None:
    with pytest.raises(RequestRejected, match="context"):
        llm.generate([ids(256, 10)], GREEDY)
    with pytest.raises(RequestRejected, match="max_tokens"):
        llm.generate([ids(200, 10)], SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([[VOCAB + 5]], GREEDY)
    assert_no_leak(llm)


def test_abort_frees_blocks_at_once(llm: LLM) -> None:
    eng = llm.engine
    eng.add_request("a", ids(50, 11), SamplingParams(max_tokens=50))
    eng.add_request("b", ids(20, 12), SamplingParams(max_tokens=50))
    eng.step()
    eng.step()
    assert eng.block_manager.num_free_blocks < eng.block_manager.num_blocks
    final = eng.abort_request("a")
    assert final is not None and final.finished and final.outputs[0].finish_reason == FinishReason.ABORT.value
    eng.abort_request("b")
    assert_no_leak(llm)


def test_startup_error_says_what_to_lower(checkpoint) -> None:
    with pytest.raises(ValueError, match="lower max_model_len"):
        LLM(str(checkpoint("llama")), block_size=16, num_kv_blocks=4, max_model_len=512)


def test_metrics_count_tokens_and_latencies(llm: LLM) -> None:
    before = llm.engine.get_metrics()
    llm.generate([ids(10, 13), ids(15, 14)], SamplingParams(temperature=0, max_tokens=5))
    m = llm.engine.get_metrics()
    assert m.generation_tokens - before.generation_tokens == 10
    assert m.prompt_tokens - before.prompt_tokens == 25
    assert m.ttft.count - before.ttft.count == 2
    assert m.itl.count - before.itl.count == 8
    assert m.e2e_latency.count - before.e2e_latency.count == 2
    assert m.num_running == 0 and m.num_waiting == 0 and m.kv_usage == 0.0
    assert 0.0 < m.kv_token_utilization <= 1.0


def test_profile_run_builds_a_valid_largest_batch(llm: LLM) -> None:
    """The CUDA sizing profile (one forward at the largest batch) also runs on CPU."""
    assert llm.engine.runner._profile_run() > 0


def test_priority_policy_serves_lower_priority_values_first(checkpoint) -> None:
    llm = LLM(str(checkpoint("llama")), block_size=8, num_kv_blocks=64, max_model_len=128,
              max_num_seqs=1, scheduling_policy="priority")
    outs = llm.generate([ids(10, 20), ids(10, 21), ids(10, 22)], SamplingParams(temperature=0, max_tokens=3),
                        priority=[5, 0, 2], use_tqdm=True)
    order = sorted(range(3), key=lambda i: outs[i].first_token_time or 0.0)
    assert order == [1, 2, 0]


# -- concurrency invariants: a request's output never depends on what runs beside it -------------

SHARED = ids(50, 30)  # three full 16-token blocks and a bit


def _mixed_requests() -> tuple[list[list[int]], list[SamplingParams]]:
    """Different lengths (1, exact block multiples, ragged), a shared three-block prefix, identical
    prompts, and seeded sampling with n = 2, as a batch of users would send them."""
    prompts = [ids(1, 31), ids(16, 32), ids(37, 33), SHARED + ids(3, 34), SHARED + ids(14, 35),
               SHARED + ids(3, 34), ids(48, 36), SHARED[:48]]
    params = [SamplingParams(temperature=0, max_tokens=m) for m in (20, 16, 11, 25, 9, 25, 16, 13)]
    prompts.append(ids(21, 37))
    params.append(SamplingParams(temperature=0.8, top_p=0.9, seed=5, n=2, max_tokens=18))
    return prompts, params


@pytest.fixture(scope="module")
def alone(checkpoint) -> list[list[list[int]]]:
    """Each of ``_mixed_requests`` run on its own (one engine, no prefix cache): the reference every
    parametrization compares with, computed once per module."""
    prompts, params = _mixed_requests()
    solo = LLM(str(checkpoint("llama")), num_kv_blocks=64, max_model_len=96, enable_prefix_caching=False)
    return [[c.token_ids for c in solo.generate([p], sp)[0].outputs] for p, sp in zip(prompts, params)]


@pytest.mark.parametrize("options", [
    dict(num_kv_blocks=64),  # one batch, prefix cache on
    dict(num_kv_blocks=64, max_num_batched_tokens=16),  # chunked prefill beside decodes
    dict(num_kv_blocks=6, max_num_batched_tokens=24),  # six blocks: preemption and eviction
    dict(num_kv_blocks=6, max_num_seqs=3, enable_prefix_caching=False),
], ids=["batch", "chunked", "preempt", "preempt-nocache"])
def test_batched_output_equals_each_request_alone(checkpoint, alone: list[list[list[int]]], options: dict) -> None:
    """Greedy and seeded outputs are token-exact whatever the batch, chunking, preemption or
    prefix cache (float32 on CPU: no tolerance needed); run twice so the second pass takes what
    the first left in (or evicted from) the cache; every block is free afterwards."""
    prompts, params = _mixed_requests()
    expected = alone
    llm = LLM(str(checkpoint("llama")), max_model_len=96, **options)
    for _ in range(2):
        outs = llm.generate(prompts, params)
        assert [[c.token_ids for c in o.outputs] for o in outs] == expected
        assert_no_leak(llm)
    if options["num_kv_blocks"] == 6:
        assert llm.engine.scheduler.num_preemptions > 0


def test_a_fully_cached_prompt_and_an_evicted_one_give_the_same_tokens(checkpoint) -> None:
    """A prompt of exactly three blocks, all cached, still computes its last block (to sample);
    once evicted by other prompts it is recomputed, with the same output."""
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=8, max_model_len=128)
    prompt = ids(48, 40)
    first = llm.generate([prompt], GREEDY)[0]
    again = llm.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens == 32 and again.outputs[0].token_ids == first.outputs[0].token_ids
    root = llm.engine.block_manager.cache_summary(64).root_hashes[0]
    llm.generate([ids(100, 41), ids(100, 42)], GREEDY)  # 7 blocks each: the cache turns over
    assert root not in llm.engine.block_manager.cache_summary(64).root_hashes
    evicted = llm.generate([prompt], GREEDY)[0]
    assert evicted.num_cached_tokens == 0 and evicted.outputs[0].token_ids == first.outputs[0].token_ids
    assert_no_leak(llm)


@pytest.mark.parametrize("prompt_len, max_tokens", [(16, 16), (15, 1), (15, 17), (1, 31), (48, 48)])
def test_max_tokens_ending_on_a_block_boundary(checkpoint, prompt_len: int, max_tokens: int) -> None:
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=8, max_model_len=96)
    out = llm.generate([ids(prompt_len, 43)], SamplingParams(temperature=0, max_tokens=max_tokens))[0].outputs[0]
    assert len(out.token_ids) == max_tokens and out.finish_reason == "length"
    whole = llm.generate([ids(prompt_len, 43)], SamplingParams(temperature=0, max_tokens=None))[0].outputs[0]
    assert len(whole.token_ids) == 96 - prompt_len and whole.finish_reason == "length"  # max_model_len
    assert_no_leak(llm)


def test_min_tokens_holds_eos_back_then_lets_it_stop(llm: LLM) -> None:
    prompt = ids(14, 44)
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids
    eos = free[2]
    saved = llm.engine.eos_token_ids, llm.engine.runner.eos_token_ids
    llm.engine.eos_token_ids, llm.engine.runner.eos_token_ids = {eos}, [eos]
    try:
        stopped = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
        held = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, min_tokens=3))[0].outputs[0]
    finally:
        llm.engine.eos_token_ids, llm.engine.runner.eos_token_ids = saved
    assert stopped.token_ids == free[:3] and stopped.finish_reason == "stop"
    assert held.token_ids[:2] == free[:2] and eos not in held.token_ids[:3]
    if eos in held.token_ids:  # a later EOS may stop it, and then it is the last token
        assert held.token_ids.index(eos) == len(held.token_ids) - 1 and held.finish_reason == "stop"
    else:
        assert len(held.token_ids) == 12
    assert_no_leak(llm)


def test_a_token_budget_below_the_batch_size_is_refused_naming_both(checkpoint) -> None:
    """As vLLM: each running sequence's decode needs a token of every step's budget."""
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(4\) must be >= max_num_seqs \(8\)"):
        LLM(str(checkpoint("llama")), num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=4)
    assert LLM(str(checkpoint("llama")), num_kv_blocks=64, max_num_batched_tokens=8).engine.config.max_num_seqs == 8


def test_a_generate_that_raises_mid_run_frees_its_blocks_and_leaves_nothing_queued(
        llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises (a model error, Ctrl-C) ends the call; its requests must not keep their KV
    blocks, nor run (unseen) in the next call."""
    execute = llm.engine.runner.execute
    calls = 0

    def fails_on_the_third_step(scheduled: list[ScheduledSeq]) -> StepResult:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("device lost")
        return execute(scheduled)

    monkeypatch.setattr(llm.engine.runner, "execute", fails_on_the_third_step)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate([ids(20, 50), ids(30, 51)], GREEDY)
    assert_no_leak(llm)
    before = llm.engine.get_metrics().generation_tokens
    llm.generate([ids(5, 52)], SamplingParams(temperature=0, max_tokens=3))
    assert llm.engine.get_metrics().generation_tokens - before == 3


def test_prompt_logprobs_and_embeddings_under_preemption_equal_each_alone(checkpoint, llm: LLM) -> None:
    """Recompute after preemption neither repeats prompt logprobs nor double-counts a mean pool."""
    prompts = [SHARED + ids(5, 60), SHARED[:32], ids(40, 61), ids(7, 62)]
    params = SamplingParams(temperature=0, max_tokens=12, prompt_logprobs=1)

    def key(o: RequestOutput) -> tuple[list[int], list[int], list[float]]:  # outputs; scored prompt tokens
        scored = [x for x in o.prompt_logprobs or [] if x is not None]
        return o.outputs[0].token_ids, [x.token_id for x in scored], [x.logprob for x in scored]

    alone = [key(llm.generate([p], params)[0]) for p in prompts]
    mean = PoolingParams(pooling="mean")
    embeddings = [llm.embed([p], mean)[0] for p in prompts]
    tight = LLM(str(checkpoint("llama")), num_kv_blocks=6, max_model_len=96, max_num_batched_tokens=16)
    for (tokens, scored, logprobs), want in zip(map(key, tight.generate(prompts, params)), alone):
        assert (tokens, scored) == want[:2] and logprobs == pytest.approx(want[2], abs=1e-4)
    got = tight.embed(prompts, mean)
    assert all(max(abs(x - y) for x, y in zip(g, e)) < 1e-5 for g, e in zip(got, embeddings))
    assert tight.engine.scheduler.num_preemptions > 0
    assert_no_leak(tight)


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_a_request_as_large_as_the_cache_runs_amid_a_stream_of_small_ones(checkpoint, policy: str) -> None:
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=6, max_model_len=96, scheduling_policy=policy)
    eng = llm.engine
    big, params = ids(80, 63), SamplingParams(temperature=0, max_tokens=16)  # 96 tokens: the whole cache
    expected = llm.generate([big], params)[0].outputs[0].token_ids
    for i in range(3):
        eng.add_request(f"s{i}", ids(20, 64 + i), SamplingParams(temperature=0, max_tokens=30), tenant="a")
    eng.step()
    eng.add_request("big", big, params, tenant="b")
    got, steps = None, 0
    while eng.has_unfinished_requests() and steps < 2000:
        steps += 1
        if steps % 2 == 0 and steps < 200:  # a new small request every other step
            eng.add_request(f"x{steps}", ids(10, steps), SamplingParams(temperature=0, max_tokens=20), tenant="a")
        got = next((o.outputs[0].token_ids for o in eng.step() if o.request_id == "big" and o.finished), got)
    assert got == expected
    assert_no_leak(llm)
    with pytest.raises(RequestRejected):  # past the cache (here also the context): refused on entry
        llm.generate([ids(90, 65)], SamplingParams(max_tokens=7))
    assert_no_leak(llm)


def _state(seq: Sequence) -> str:
    if seq.status.value == "waiting":
        return "preempted" if seq.num_preemptions else "waiting"
    return "prefilling" if seq.is_prefilling else "decoding"


def test_n_2_requests_aborted_prefilling_decoding_waiting_or_preempted_free_every_block(checkpoint) -> None:
    for caching in (True, False):
        llm = LLM(str(checkpoint("llama")), num_kv_blocks=5, max_model_len=64, max_num_batched_tokens=16,
                  enable_prefix_caching=caching)
        eng = llm.engine
        for i in range(8):
            eng.add_request(f"r{i}", ids(33, 70 + i % 3), SamplingParams(n=2, temperature=0.7, seed=i, max_tokens=20))
        aborted: set[str] = set()
        while eng.has_unfinished_requests():
            eng.step()
            for request_id, req in list(eng._requests.items()):
                states = {_state(s) for s in req.seqs if not s.is_finished}
                if states - aborted:  # a state no abort has hit yet
                    aborted |= states
                    eng.abort_request(request_id)
                    break
        assert aborted == {"prefilling", "decoding", "waiting", "preempted"}
        assert_no_leak(llm)
        assert not eng.block_manager._chains and (caching or eng.block_manager.pool.num_cached == 0)
