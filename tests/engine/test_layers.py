"""Layer-level equality with the transformers modules they replace."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from engine.layers import GatedMLP, MergedLinear, RMSNorm, get_rope
from engine.layers.rotary import rope_parameters


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ref = LlamaRMSNorm(32, eps=1e-5).to(dtype)
    ref.weight.data = torch.randn(32).to(dtype)
    ours = RMSNorm(32, eps=1e-5).to(dtype)
    ours.weight.data.copy_(ref.weight.data)
    x, res = torch.randn(5, 32).to(dtype), torch.randn(5, 32).to(dtype)
    torch.testing.assert_close(ours(x), ref(x), atol=0, rtol=0)
    normed, summed = ours(x, res)
    torch.testing.assert_close(summed, x + res)
    torch.testing.assert_close(normed, ref(x + res), atol=0, rtol=0)


ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rotary_matches_transformers(case: str) -> None:
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, rope_theta=5000.0,
                      max_position_embeddings=512, rope_scaling=ROPE_CASES[case])
    head_dim = 32
    ref = LlamaRotaryEmbedding(cfg)
    ours = get_rope(cfg, head_dim)
    positions = torch.tensor([0, 1, 2, 17, 63, 64, 65, 300, 511])
    q, k = torch.randn(len(positions), 4, head_dim), torch.randn(len(positions), 2, head_dim)
    cos, sin = ref(q, positions[None])
    # transformers works on [B, H, T, D]; ours on [T, H, D]
    rq, rk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    oq, ok = ours(positions, q, k)
    torch.testing.assert_close(oq, rq[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ok, rk[0].transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_rope_parameters_from_transformers_4_style_config() -> None:
    legacy = SimpleNamespace(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0})
    assert rope_parameters(legacy) == {"type": "linear", "factor": 2.0, "rope_type": "linear", "rope_theta": 500000.0}
    assert rope_parameters(SimpleNamespace())["rope_type"] == "default"


def test_rotary_rejects_sequence_length_dependent_types() -> None:
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="unsupported rope_type 'dynamic'"):
        get_rope(cfg, 32)


def test_gated_mlp_matches_transformers() -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act="silu")
    ref = LlamaMLP(cfg)
    ours = GatedMLP(32, 48)
    ours.gate_up_proj.load_shard(0, ref.gate_proj.weight.data)
    ours.gate_up_proj.load_shard(1, ref.up_proj.weight.data)
    ours.down_proj.weight.data.copy_(ref.down_proj.weight.data)
    x = torch.randn(7, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-6, rtol=1e-5)


def test_merged_linear_shards_and_shape_errors() -> None:
    lin = MergedLinear(4, [3, 2], bias=True)
    lin.load_shard(1, torch.ones(2, 4))
    lin.load_shard(1, torch.full((2,), 5.0), is_bias=True)
    a, b = lin.split(lin(torch.ones(1, 4)))
    assert a.shape == (1, 3) and torch.equal(b, torch.full((1, 2), 9.0))
    with pytest.raises(ValueError, match="expected shape"):
        lin.load_shard(0, torch.ones(2, 4))
