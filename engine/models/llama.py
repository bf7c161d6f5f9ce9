"""Llama-family decoder (Llama 1-3.x), also the base of the Mistral, Qwen2 and Qwen3 models.

Weights use fused q/k/v and gate/up projections; ``load_weights`` maps Hugging Face checkpoint
names onto them. The sliding window of the architectures that have one (``sliding_window = True``
on their attention class: Mistral, Qwen2, Qwen3) is applied in the attention mask (per layer,
following ``layer_types`` when the config has it), so outputs match transformers at any length;
the blocks that fall out of the window are not released early (the cache is sized for full
attention). Llama has none: like transformers, it ignores a ``sliding_window`` in its config.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.attention_metadata import AttentionMetadata
from engine.layers import GatedMLP, MergedLinear, PagedAttention, RMSNorm, RotaryEmbedding, get_rope

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) of this step's positions
_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_GATE_UP = {"gate_proj": 0, "up_proj": 1}


def head_dim_of(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def sliding_window_of(cfg: Any, layer: int) -> int | None:
    """The attention window of one layer, as transformers decides it (None = full attention)."""
    window = getattr(cfg, "sliding_window", None)
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer] == "sliding_attention" else None
    return window


class LlamaAttention(nn.Module):
    qk_norm = False
    sliding_window = False  # whether the config's sliding_window applies (transformers' Llama ignores it)

    @staticmethod
    def biases(cfg: Any) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o_proj)."""
        bias = bool(getattr(cfg, "attention_bias", False))
        return bias, bias

    def __init__(self, cfg: Any, layer: int, attn_backend: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = d = head_dim_of(cfg)
        qkv_bias, o_bias = self.biases(cfg)
        sizes = [self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d]
        self.qkv_proj = MergedLinear(cfg.hidden_size, sizes, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, cfg.hidden_size, bias=o_bias)
        if self.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        window = sliding_window_of(cfg, layer) if self.sliding_window else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d**-0.5,
                                   sliding_window=window, backend=attn_backend)

    def forward(self, rope: Rope, x: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        t, hq, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        if self.qk_norm:
            q = self.q_norm(qkv[:, : hq * d].view(t, hq, d))
            k = self.k_norm(qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d))
            q, k = RotaryEmbedding.rotate_qk(q, k, *rope)
        else:  # q and k heads sit side by side in the fused output: rotate them in one pass
            qk = RotaryEmbedding.rotate(qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d), *rope)
            q, k = qk[:, :hq], qk[:, hq:]
        o = self.attn(q, k, v, kv_cache, meta)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    attention_cls: type[LlamaAttention] = LlamaAttention

    def __init__(self, cfg: Any, layer: int, attn_backend: str) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(cfg, layer, attn_backend)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=bool(getattr(cfg, "mlp_bias", False)),
                            act=cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, rope: Rope, h: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(rope, h, kv_cache, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: Any, layer_cls: type[LlamaDecoderLayer], attn_backend: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = get_rope(cfg, head_dim_of(cfg))
        self.layers = nn.ModuleList(layer_cls(cfg, i, attn_backend) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        rope = self.rotary.cos_sin(positions, h.dtype)  # once per step, shared by every layer
        residual = None
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(rope, h, residual, cache, meta)
        h, _ = self.norm(h, residual)
        return h


class LlamaForCausalLM(nn.Module):
    """``forward(input_ids [T], positions [T], kv_caches, meta) -> hidden [T, H]``;
    ``compute_logits(hidden [N, H]) -> float32 [N, V]``."""

    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(self, hf_config: Any, attn_backend: str = "torch") -> None:
        super().__init__()
        self.config = hf_config
        self.model = LlamaModel(hf_config, self.layer_cls, attn_backend)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.lm_head = nn.Linear(hf_config.hidden_size, hf_config.vocab_size, bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the fused parameters; raise if anything is missing."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue  # the embedding is the head
            target, shard = _map_name(name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
            param = params[target]
            with torch.no_grad():
                if shard is None:
                    if param.shape != tensor.shape:
                        raise ValueError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
                    param.data.copy_(tensor)
                else:
                    module: Any = self.get_submodule(target.rsplit(".", 1)[0])  # a fused linear: load_shard
                    module.load_shard(shard, tensor, is_bias=target.endswith(".bias"))
            loaded.add(f"{target}#{shard}" if shard is not None else target)
        self._check_complete(params, loaded)

    def _check_complete(self, params: dict[str, nn.Parameter], loaded: set[str]) -> None:
        missing = []
        for name in params:
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            module_name, _, leaf = name.rpartition(".")
            module = self.get_submodule(module_name) if module_name else self
            if isinstance(module, MergedLinear):
                missing += [f"{name}[shard {i}]" for i in range(len(module.out_sizes)) if f"{name}#{i}" not in loaded]
            elif name not in loaded:
                missing.append(name)
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")


def _map_name(hf_name: str) -> tuple[str, int | None]:
    """HF name -> (our parameter name, shard index in a fused layer or None)."""
    for part, shard in _QKV.items():
        if f".self_attn.{part}." in hf_name:
            return hf_name.replace(f".self_attn.{part}.", ".self_attn.qkv_proj."), shard
    for part, shard in _GATE_UP.items():
        if f".mlp.{part}." in hf_name:
            return hf_name.replace(f".mlp.{part}.", ".mlp.gate_up_proj."), shard
    return hf_name, None
