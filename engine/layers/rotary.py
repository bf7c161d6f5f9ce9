"""Rotary position embeddings (neox / "rotate half" layout, as Llama, Mistral and Qwen use).

Inverse frequencies follow transformers' formulas for the rope types we support: ``default``,
``linear``, ``llama3`` (Llama 3.1+) and ``yarn``. ``dynamic`` and ``longrope`` rescale by the
current sequence length, which a paged batch of many sequences cannot honour per sequence, so
they are rejected with a clear error instead of silently producing different numbers.
A ``freq_factors`` list in the parameters (llama.cpp's per-dimension rope factors, which a Llama
3.1+ GGUF file carries as its ``rope_freqs`` tensor in place of ``rope_scaling``) divides the
inverse frequencies of any type, as llama.cpp applies them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The rope settings of a config, whether written as transformers 5 ``rope_parameters``
    or as transformers 4 ``rope_theta`` + ``rope_scaling``."""
    params: dict[str, Any] = {}
    scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params.update(scaling)
    modern = getattr(hf_config, "rope_parameters", None)
    if isinstance(modern, dict):
        params.update(modern)
    if "rope_type" not in params:
        params["rope_type"] = params.get("type", "default")
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    return params


def compute_inv_freq(params: dict[str, Any], head_dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim/2] float32, attention_scaling)`` for the given rope parameters."""
    inv_freq, scaling = _type_inv_freq(params, head_dim, max_position)
    factors = params.get("freq_factors")
    if factors is None:
        return inv_freq, scaling
    if len(factors) != len(inv_freq):
        raise ValueError(f"freq_factors has {len(factors)} entries; the rotary embedding has {len(inv_freq)}")
    return inv_freq / torch.tensor(factors, dtype=torch.float32, device="cpu"), scaling


def _type_inv_freq(params: dict[str, Any], head_dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    rope_type = params["rope_type"]
    base = float(params["rope_theta"])
    dim = head_dim
    exps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / dim
    inv_freq = 1.0 / (base**exps)
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, params), 1.0
    if rope_type == "yarn":
        return _yarn(base, dim, params, max_position)
    raise ValueError(
        f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor = float(p["factor"])
    low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(base: float, dim: int, p: dict[str, Any], max_position: int) -> tuple[torch.Tensor, float]:
    orig = p.get("original_max_position_embeddings") or max_position
    factor = p.get("factor") or max_position / orig
    attn = p.get("attention_factor")
    if attn is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = _yarn_mscale(factor, ms) / _yarn_mscale(factor, ms_all) if ms and ms_all else _yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").to(torch.float32) / dim)
    extra = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv_freq, float(attn)


class RotaryEmbedding(nn.Module):
    """``forward(positions [T], q [T, Hq, D], k [T, Hkv, D]) -> (q, k)`` rotated; models compute
    ``cos_sin(positions)`` once per step and call ``apply`` in every layer.

    cos/sin are computed from the positions in float32 exactly as transformers does, then cast to
    the activations' dtype. ``cos_sin`` returns sin with its first half negated, so a rotation is
    ``x * cos + x.roll(D / 2) * sin``: transformers' ``x * cos + rotate_half(x) * sin`` bit for bit
    (negation is exact) in two ops fewer. ``inv_freq`` is a plain attribute (not a buffer) so that building the
    model on the meta device and materialising it with ``to_empty`` keeps it intact.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0) -> None:
        super().__init__()
        self.inv_freq = inv_freq
        self.attention_scaling = attention_scaling
        self._device_inv_freq: dict[torch.device, torch.Tensor] = {}

    def _freqs_on(self, device: torch.device) -> torch.Tensor:
        cached = self._device_inv_freq.get(device)
        if cached is None:
            cached = self._device_inv_freq[device] = self.inv_freq.to(device)
        return cached

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self._freqs_on(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        half = sin.shape[-1] // 2
        sin[:, :half].neg_()  # rotate_half's minus sign, folded in once per step
        return cos[:, None, :], sin[:, None, :]

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotate_qk(q, k, *self.cos_sin(positions, q.dtype))

    @staticmethod
    def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate with precomputed ``cos_sin`` (computed once per step, shared by all layers)."""
        return RotaryEmbedding.rotate(q, cos, sin), RotaryEmbedding.rotate(k, cos, sin)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One tensor of heads ``[T, H, D]`` (e.g. q and k side by side: one pass for both), with
        ``cos_sin``'s sign-folded sin."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def get_rope(hf_config: Any, head_dim: int) -> RotaryEmbedding:
    """The rotary embedding a HF config asks for."""
    params = rope_parameters(hf_config)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported by the native models")
    max_position = int(getattr(hf_config, "max_position_embeddings", 2048))
    inv_freq, scaling = compute_inv_freq(params, head_dim, max_position)
    return RotaryEmbedding(inv_freq, scaling)
