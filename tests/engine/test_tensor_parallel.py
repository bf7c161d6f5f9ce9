"""Tensor parallelism: 2 gloo ranks on CPU give the same greedy tokens as 1 rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.loader import load_model
from engine.tensor_parallel import shard_model, start_tensor_parallel
from engine.tiny_model import build_tiny_model

PROMPTS = ["Once upon a time", "The shop opens at", "hello " * 40]  # the last one spans several blocks


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tp") / "tiny", seed=4)


def test_two_gloo_ranks_match_one_rank_greedy(model_path: Path) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.0)
    engine_args = {"num_kv_blocks": 64, "max_model_len": 512}
    reference = [o.outputs[0].token_ids for o in LLM(str(model_path), **engine_args).generate(PROMPTS, params)]
    group = start_tensor_parallel(EngineConfig(model=str(model_path), **engine_args), 2)
    try:
        assert group.engine.runner.layout.num_kv_heads == 1  # 2 KV heads split over 2 ranks
        for i, prompt in enumerate(PROMPTS):
            group.engine.add_request(str(i), prompt, params, stream=False)
        done: dict[str, list[int]] = {}
        while group.engine.has_unfinished_requests():
            for out in group.engine.step():
                if out.finished:
                    done[out.request_id] = list(out.outputs[0].token_ids)
    finally:
        group.shutdown()
    assert [done[str(i)] for i in range(len(PROMPTS))] == [list(r) for r in reference]
    assert all(not w.is_alive() and w.exitcode == 0 for w in group.workers)


def test_a_size_that_does_not_divide_the_heads_is_a_clear_error(model_path: Path) -> None:
    model, _ = load_model(model_path)
    with pytest.raises(ValueError, match="tensor parallel size 3 does not divide"):
        shard_model(model, 0, 3)
