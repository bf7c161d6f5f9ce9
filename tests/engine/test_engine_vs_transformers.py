"""THE engine test: greedy tokens identical to transformers' generate, logprobs within 1e-4
(float32), on the same seeded random weights, for every native architecture, with mixed prompt
lengths, with chunked prefill forced and with preemption forced."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
import torch
import transformers

from engine import LLM, SamplingParams

from .hf_checkpoints import ARCHS, checkpoint  # noqa: F401  (fixture)

MAX_NEW = 12
PROMPT_LENS = [3, 37, 16, 61, 9, 24]

MODES = {
    "plain": dict(max_num_batched_tokens=2048, num_kv_blocks=256),
    "chunked": dict(max_num_batched_tokens=13, num_kv_blocks=256),
    "preempt": dict(max_num_batched_tokens=2048, num_kv_blocks=10, max_model_len=80),
}


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(vocab) for _ in range(n)] for n in PROMPT_LENS]


@cache
def reference(path: str) -> list[tuple[list[int], list[float]]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for p in prompts(model.config.vocab_size):
        gen = model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=MAX_NEW,
            min_new_tokens=MAX_NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        tokens = gen.sequences[0, len(p) :].tolist()
        logprobs = [
            torch.log_softmax(step[0].float(), dim=-1)[t].item() for step, t in zip(gen.logits, tokens)
        ]
        out.append((tokens, logprobs))
    return out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_matches_transformers(arch: str, mode: str, checkpoint) -> None:
    path: Path = checkpoint(arch)
    expected = reference(str(path))
    llm = LLM(str(path), block_size=8, **MODES[mode])
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, logprobs=2)
    outs = llm.generate(prompts(llm.engine.hf_config.vocab_size), params)
    for out, (tokens, logprobs) in zip(outs, expected):
        got = out.outputs[0]
        assert got.token_ids == tokens
        assert got.finish_reason == "length"
        assert got.logprobs is not None
        diffs = [abs(a.logprob - b) for a, b in zip(got.logprobs, logprobs)]
        assert max(diffs) < 1e-4
    metrics = llm.engine.get_metrics()
    if mode == "preempt":
        assert metrics.num_preemptions > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
