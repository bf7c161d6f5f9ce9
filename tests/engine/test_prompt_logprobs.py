"""Prompt logprobs (``SamplingParams.prompt_logprobs``) equal a full transformers forward of the same
seeded weights within 1e-4, with each token's vocabulary rank, in chunked prefill and for a prompt
whose prefix the cache already holds (every position is computed again)."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from engine import LLM, SamplingParams

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)

K = 3


@pytest.mark.parametrize("budget", [2048, 13])  # 13: the prompt is prefilled in chunks
def test_prompt_logprobs_equal_a_full_forward_with_a_cached_prefix(checkpoint, budget: int) -> None:
    path = str(checkpoint("llama"))
    llm = LLM(path, block_size=8, num_kv_blocks=128, max_model_len=256, max_num_batched_tokens=budget)
    rng = random.Random(3)
    prompt = [rng.randrange(384) for _ in range(40)]
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))  # the prefix cache now holds it
    assert llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))[0].num_cached_tokens > 0
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=K))[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    for p in range(1, len(prompt)):
        lp, row = got[p], want[p - 1]
        assert lp is not None and lp.token_id == prompt[p]
        assert lp.logprob == pytest.approx(row[prompt[p]].item(), abs=1e-4)
        assert lp.rank == int((row >= row[prompt[p]]).sum())
        values, ids = row.topk(K)
        assert list(lp.top) == ids.tolist() and list(lp.top.values()) == pytest.approx(values.tolist(), abs=1e-4)


def test_max_tokens_zero_scores_a_prompt_as_long_as_the_context(checkpoint) -> None:
    """``max_tokens=0`` processes the prompt alone: its logprobs, no token, finish "length", a
    prompt filling the whole context included (one more token to generate has no room)."""
    llm = LLM(str(checkpoint("llama")), block_size=8, num_kv_blocks=64, max_model_len=64)
    prompt = [random.Random(5).randrange(384) for _ in range(64)]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=1))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].text == "" and out.outputs[0].finish_reason == "length"
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == 64
    assert llm.generate([prompt[:10]], SamplingParams(max_tokens=0))[0].outputs[0].token_ids == []
    with pytest.raises(ValueError, match="at least one must be left"):
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
