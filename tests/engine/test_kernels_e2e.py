"""The engine's greedy equality with transformers, with the Triton attention path selected
(interpreter mode on CPU): same tokens, logprobs within 1e-4 in float32."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before engine.kernels is first imported

import pytest

from engine import LLM, SamplingParams

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)
from .test_engine_vs_transformers import MAX_NEW, MODES, prompts, reference


@pytest.mark.parametrize("arch,mode", [("llama", "chunked"), ("qwen3", "plain")])
def test_greedy_matches_transformers_with_triton(arch: str, mode: str, checkpoint) -> None:
    path = checkpoint(arch)
    expected = reference(str(path))
    llm = LLM(str(path), block_size=16, attn_backend="triton", **MODES[mode])
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, logprobs=2)
    outs = llm.generate(prompts(llm.engine.hf_config.vocab_size), params)
    for out, (tokens, logprobs) in zip(outs, expected):
        got = out.outputs[0]
        assert got.token_ids == tokens
        assert got.logprobs is not None
        assert max(abs(a.logprob - b) for a, b in zip(got.logprobs, logprobs)) < 1e-4
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
    assert llm.engine.runner.graphs is None  # no CUDA graphs on CPU


def test_cuda_graph_ladder() -> None:
    from engine.cuda_graphs import ladder_for

    assert ladder_for(1) == [1]
    assert ladder_for(20) == [1, 2, 4, 8, 16, 20]
    sizes = ladder_for(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and sizes == sorted(set(sizes))


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import EngineConfig

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        EngineConfig(model="unused", attn_backend="triton")
