"""AsyncEngine: streaming deltas, concurrency, abort (explicit and by leaving the iterator)."""

from __future__ import annotations

import asyncio
import gc
import random
import time

import pytest

from engine import AsyncEngine, EngineConfig, LLMEngine, RequestRejected, SamplingParams

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(384) for _ in range(n)]


@pytest.fixture(scope="module")
def engine(checkpoint) -> LLMEngine:
    return LLMEngine(EngineConfig(str(checkpoint("llama")), block_size=8, num_kv_blocks=128, max_model_len=256))


async def collect(it) -> list:
    return [o async for o in it]


async def wait_idle(eng: AsyncEngine) -> None:
    for _ in range(500):
        if not eng.engine.has_unfinished_requests():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("engine did not become idle")


def assert_all_free(eng: AsyncEngine) -> None:
    bm = eng.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


async def test_stream_deltas_add_up_and_match_offline(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    params = SamplingParams(temperature=0, max_tokens=9, logprobs=1)
    prompts = [ids(n, n) for n in (5, 30, 12)]
    streams = [eng.add_request(f"s{i}", p, params) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(collect(s) for s in streams))
    for outs in results:
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        final = outs[-1].outputs[0]
        streamed = [t for o in outs for t in o.outputs[0].delta_token_ids]
        assert streamed == final.token_ids and len(streamed) == 9
        assert len([lp for o in outs for lp in (o.outputs[0].delta_logprobs or [])]) == 9
    for p, outs in zip(prompts, results):
        engine.add_request("offline", p, params)
        last = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                last = o
        assert last is not None and last.outputs[0].token_ids == outs[-1].outputs[0].token_ids
    await eng.shutdown()


async def test_leaving_the_iterator_aborts_and_frees_blocks(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    it = eng.add_request("gone", ids(40, 1), SamplingParams(temperature=0, max_tokens=150))
    seen = 0
    async for _ in it:
        seen += 1
        if seen == 3:
            break
    await it.aclose()
    await wait_idle(eng)
    assert_all_free(eng)
    await eng.shutdown()


async def test_explicit_abort_ends_the_stream(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    it = eng.add_request("cancel-me", ids(10, 2), SamplingParams(temperature=0, max_tokens=150))
    first = await it.__anext__()
    assert not first.finished
    eng.abort("cancel-me")
    rest = await collect(it)
    assert rest and rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    await wait_idle(eng)
    assert_all_free(eng)
    await eng.shutdown()


async def test_an_abort_before_the_engine_took_the_request_in_ends_its_stream(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    it = eng.add_request("early", ids(10, 4), SamplingParams(temperature=0, max_tokens=20))
    eng.abort("early")  # still waiting to join the engine
    rest = await asyncio.wait_for(collect(it), 10)
    assert rest and rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    await wait_idle(eng)
    assert_all_free(eng)
    await eng.shutdown()


async def test_an_abort_during_the_step_that_finishes_the_request_keeps_its_last_output(
        engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    step = engine.step

    def slow_step() -> list:
        time.sleep(0.2)  # long enough for the abort below to come while it runs
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    eng = AsyncEngine(engine=engine)
    it = eng.add_request("last", ids(10, 5), SamplingParams(temperature=0, max_tokens=1))
    for _ in range(1000):  # the step that prefills and samples its one token is running
        if eng._in_flight:
            break
        await asyncio.sleep(0.001)
    assert eng._in_flight
    eng.abort("last")
    rest = await asyncio.wait_for(collect(it), 10)
    assert rest and rest[-1].finished and rest[-1].outputs[0].finish_reason in ("length", "abort")
    await wait_idle(eng)
    assert_all_free(eng)
    await eng.shutdown()


async def test_rejection_is_raised_on_add(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    with pytest.raises(RequestRejected):
        eng.add_request("long", ids(300, 3), SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request("bad", [10_000], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    assert not eng.engine.has_unfinished_requests()
    await eng.shutdown()


async def test_event_loop_keeps_running_during_steps(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    outs = await collect(eng.add_request("t", ids(60, 4), SamplingParams(temperature=0, max_tokens=40)))
    done.set()
    await task
    assert outs[-1].finished
    assert ticks > len(outs)  # the loop ran other work while the model stepped in its thread
    await eng.shutdown()


async def test_n_completions_stream_side_by_side(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6)
    outs = await collect(eng.add_request("pair", ids(20, 5), params))
    final = outs[-1]
    assert final.finished and [c.index for c in final.outputs] == [0, 1]
    for i in range(2):
        assert [t for o in outs for t in o.outputs[i].delta_token_ids] == final.outputs[i].token_ids
        assert len(final.outputs[i].token_ids) == 6
    await wait_idle(eng)
    assert_all_free(eng)
    await eng.shutdown()


async def test_failed_step_leaves_no_unwritten_blocks_in_the_prefix_cache(checkpoint) -> None:
    """The model raises on the first step: every request fails. The same prompt again must not
    take the never-written blocks of the failed step from the prefix cache."""
    config = EngineConfig(str(checkpoint("llama")), block_size=8, num_kv_blocks=64, max_model_len=256)
    prompt = ids(41, 9)
    params = SamplingParams(temperature=0, max_tokens=8)
    fresh = LLMEngine(config)
    fresh.add_request("ref", prompt, params, stream=False)
    expected = None
    while fresh.has_unfinished_requests():
        for o in fresh.step():
            expected = o.outputs[0].token_ids
    engine = LLMEngine(config)
    execute, calls = engine.runner.execute, [0]

    def execute_failing_once(scheduled):
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("device lost")
        return execute(scheduled)

    engine.runner.execute = execute_failing_once
    eng = AsyncEngine(engine=engine)
    with pytest.raises(RuntimeError, match="engine step failed"):
        await collect(eng.add_request("a", prompt, params))
    assert engine.block_manager.pool.num_cached == 0
    outs = await collect(eng.add_request("b", prompt, params))
    assert outs[-1].num_cached_tokens == 0
    assert outs[-1].outputs[0].token_ids == expected
    assert_all_free(eng)
    await eng.shutdown()


async def test_cancel_tells_a_request_the_engine_never_started_from_one_it_ran(
        checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RequestStream.cancel`` returns the final output once the abort has applied: a request still
    queued (one sequence at a time) was never scheduled; one the engine ran, or was running in the
    step under way when it was cancelled, was; also when its iterator was left first."""
    engine = LLMEngine(EngineConfig(str(checkpoint("llama")), block_size=8, num_kv_blocks=64, max_model_len=256,
                                    max_num_seqs=1))
    eng = AsyncEngine(engine=engine)
    running = eng.add_request("running", ids(20, 6), SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    queued = eng.add_request("queued", ids(20, 7), SamplingParams(temperature=0, max_tokens=4))
    assert not (await running.__anext__()).finished
    assert engine.get_metrics().num_waiting == 1
    never = await queued.cancel()
    assert never is not None and never.first_scheduled_time is None and never.outputs[0].finish_reason == "abort"
    await running.aclose()  # left early: the iterator aborts it
    ran = await running.cancel()
    assert ran is not None and ran.first_scheduled_time is not None and ran.outputs[0].finish_reason == "abort"
    done = eng.add_request("done", ids(10, 8), SamplingParams(temperature=0, max_tokens=2))
    outs = await collect(done)
    assert await done.cancel() is outs[-1]

    step = engine.step

    def slow_step() -> list:
        time.sleep(0.2)  # long enough for the cancel below to come while it runs
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    prefilling = eng.add_request("prefilling", ids(30, 9), SamplingParams(temperature=0, max_tokens=50))
    for _ in range(1000):  # the step that schedules its prefill is running
        if eng._in_flight:
            break
        await asyncio.sleep(0.001)
    assert eng._in_flight
    started = await prefilling.cancel()
    assert started is not None and started.first_scheduled_time is not None
    await wait_idle(eng)
    assert_all_free(eng)
    await eng.shutdown()


async def test_a_shutdown_ends_a_request_not_yet_taken_in_with_a_final_output(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    late = eng.add_request("late", ids(10, 10), SamplingParams(temperature=0, max_tokens=4))
    await eng.shutdown()  # before the engine loop took the request in
    final = await asyncio.wait_for(late.cancel(), 10)
    assert final is not None and final.first_scheduled_time is None and final.outputs[0].finish_reason == "abort"
    assert_all_free(eng)


async def test_aborts_mid_prefill_and_mid_decode_free_everything_and_spare_the_others(checkpoint) -> None:
    """Six blocks and a 16-token budget: prompts are chunked and sequences preempted. Aborting some
    requests while they prefill and others while they decode frees every block and cache
    reference, and the requests left run to exactly the tokens they give alone."""
    path = str(checkpoint("llama"))
    prompts = [ids(40 + 3 * i, 60 + i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=14)
    solo = AsyncEngine(engine=LLMEngine(EngineConfig(path, num_kv_blocks=32, max_model_len=96)))
    alone = [await collect(solo.add_request(f"s{i}", p, params)) for i, p in enumerate(prompts)]
    await solo.shutdown()
    eng = AsyncEngine(engine=LLMEngine(EngineConfig(path, num_kv_blocks=6, max_model_len=96,
                                                    max_num_batched_tokens=16)))
    streams = [eng.add_request(f"r{i}", p, params) for i, p in enumerate(prompts)]

    async def abort_in_prefill(stream) -> None:
        seqs = None
        for _ in range(2000):  # until a step has computed part of its prompt, not all of it
            state = eng.engine._requests.get(stream.request_id)
            seqs = state.seqs if state is not None else seqs
            if seqs and 0 < seqs[0].num_computed_tokens < seqs[0].num_prompt_tokens:
                break
            await asyncio.sleep(0.001)
        final = await stream.cancel()  # applies after the step in flight, which may end the prefill
        assert final is not None and final.outputs[0].finish_reason == "abort"

    async def abort_in_decode(stream) -> None:
        async for out in stream:
            if len(out.outputs[0].token_ids) >= 3:
                break
        await stream.aclose()

    kept = [collect(streams[i]) for i in (1, 3, 5)]
    results = await asyncio.gather(abort_in_prefill(streams[0]), abort_in_decode(streams[2]),
                                   abort_in_prefill(streams[4]), *kept)
    for i, outs in zip((1, 3, 5), results[3:]):
        assert outs[-1].outputs[0].token_ids == alone[i][-1].outputs[0].token_ids
    await wait_idle(eng)
    bm = eng.engine.block_manager
    assert_all_free(eng)
    assert all(b.ref_cnt == 0 for b in bm.pool.blocks) and not bm._chains
    assert eng.engine.scheduler.num_preemptions > 0
    await eng.shutdown()


async def test_a_stream_dropped_unfinished_aborts_its_request_without_waiting_for_the_gc(engine: LLMEngine) -> None:
    """A consumer that breaks out of ``async for`` (or never iterates) and lets the stream go
    aborts the request at once: the stream must not sit in a reference cycle that only the cycle
    collector (disabled here) would free, generating its 200 tokens for nobody."""
    eng = AsyncEngine(engine=engine)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    before = engine.get_metrics().generation_tokens

    async def read_two() -> None:
        seen = 0
        async for _ in eng.add_request("dropped", ids(20, 11), params):
            seen += 1
            if seen == 2:
                break

    gc.disable()
    try:
        await read_two()
        eng.add_request("never-read", ids(20, 12), params)
        await wait_idle(eng)
    finally:
        gc.enable()
    assert engine.get_metrics().generation_tokens - before < 100
    assert_all_free(eng)
    assert not eng._streams
    await eng.shutdown()


async def test_closing_an_ended_stream_spares_a_new_request_with_its_id(engine: LLMEngine) -> None:
    eng = AsyncEngine(engine=engine)
    old = eng.add_request("same", ids(10, 13), SamplingParams(temperature=0, max_tokens=1))
    while "same" in eng._streams:  # finished; its final output still unread in the stream
        await asyncio.sleep(0.01)
    new = eng.add_request("same", ids(10, 14), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    await old.aclose()
    del old
    outs = await collect(new)
    assert outs[-1].outputs[0].finish_reason == "length" and len(outs[-1].outputs[0].token_ids) == 5
    await eng.shutdown()
