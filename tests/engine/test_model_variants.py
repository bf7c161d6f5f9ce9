"""Native models against transformers across the config variants real checkpoints use (rope
scaling, explicit head_dim, GQA/MQA, tied embeddings, biases, sliding windows, odd vocab sizes):
greedy tokens equal and logprobs within 1e-4, for prompts of several KV blocks, with chunked
prefill and a second round served from the prefix cache."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine import LLM, SamplingParams

CONFIGS = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256, max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             tie_word_embeddings=False, initializer_range=0.25)  # peaked logits: logprobs worth comparing
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
YARN_MSCALE = {**YARN, "mscale": 0.7, "mscale_all_dim": 1.0}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-linear-theta": ("llama", {"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-yarn-mscale-head24": ("llama", {"head_dim": 24, "rope_scaling": YARN_MSCALE}),
    "llama-mqa-tied-eps": ("llama", {"num_key_value_heads": 1, "tie_word_embeddings": True, "rms_norm_eps": 1e-2}),
    "llama-gqa4-bias": ("llama", {"num_attention_heads": 8, "attention_bias": True, "mlp_bias": True}),
    "mistral-nemo-window": ("mistral", {"head_dim": 32, "sliding_window": 12}),
    "qwen2-window-layers": ("qwen2", {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 1}),
    "qwen2-window-off-yarn": ("qwen2", {"use_sliding_window": False, "sliding_window": 12, "rope_scaling": YARN}),
    "qwen3-mqa-head16-vocab": ("qwen3", {"head_dim": 16, "num_key_value_heads": 1, "vocab_size": 301}),
    "qwen3-window-bias": ("qwen3", {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 0,
                                    "attention_bias": True}),
}
MAX_NEW = 8


def build(arch: str, path: Path, **overrides: Any) -> Path:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch](**{**SIZES, **overrides}), dtype=torch.float32)
    with torch.no_grad():  # norms and biases away from their 1 / 0 initialisation, so a misplaced one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return path


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    out = [[rng.randrange(vocab) for _ in range(n)] for n in (45, 9, 30)]
    return out + [out[0][:32] + [rng.randrange(vocab) for _ in range(5)]]  # shares four blocks with the first


def reference(path: Path) -> list[tuple[list[int], list[float]]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    out = []
    for p in prompts(model.config.vocab_size):
        gen = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
        tokens = gen.sequences[0, len(p) :].tolist()
        out.append((tokens, [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(gen.logits, tokens)]))
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_matches_transformers(name: str, tmp_path: Path) -> None:
    arch, overrides = VARIANTS[name]
    path = build(arch, tmp_path, **overrides)
    expected = reference(path)
    llm = LLM(str(path), block_size=8, num_kv_blocks=64, max_num_batched_tokens=13, enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, logprobs=1)
    for _ in range(2):  # the second round reuses the first one's cached blocks
        for out, (tokens, logprobs) in zip(llm.generate(prompts(overrides.get("vocab_size", 256)), params), expected):
            got = out.outputs[0]
            assert got.token_ids == tokens
            assert got.logprobs is not None
            assert max(abs(a.logprob - b) for a, b in zip(got.logprobs, logprobs)) < 1e-4
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("rope", [{"rope_type": "dynamic", "factor": 2.0},
                                  {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                                   "original_max_position_embeddings": 128}])
def test_sequence_length_dependent_rope_is_refused(rope: dict[str, Any], tmp_path: Path) -> None:
    path = build("llama", tmp_path, rope_scaling=rope)
    with pytest.raises(ValueError, match=f"unsupported rope_type '{rope['rope_type']}'"):
        LLM(str(path), block_size=8, num_kv_blocks=64)


def test_max_model_len_beyond_max_position_embeddings_is_refused(tmp_path: Path) -> None:
    path = build("qwen2", tmp_path, max_position_embeddings=64)
    assert LLM(str(path), block_size=8, num_kv_blocks=64).engine.max_model_len == 64
    with pytest.raises(ValueError, match="max_model_len=128 exceeds the model's max_position_embeddings=64"):
        LLM(str(path), block_size=8, num_kv_blocks=64, max_model_len=128)
