"""Transformers modules inside our engine: the HF model with our paged attention plugged in.

``paged_attention_forward`` is registered in transformers' ``AttentionInterface`` under
``ATTN_IMPLEMENTATION``; a model loaded with ``attn_implementation=ATTN_IMPLEMENTATION`` calls it
from every attention layer with q/k/v already projected and rotated. The engine's flat batch is
passed as one row ``[1, T]`` with explicit ``position_ids``; the function writes K/V into the
layer's block cache and attends through the block tables (``AttentionMetadata``), so the
scheduler, prefix cache and sampler see a model like any native one. transformers builds no mask
for an attention implementation it does not know, so no ``T x T`` mask is ever built.

The step's caches and metadata reach the attention function through a ``ContextVar`` set for the
duration of ``forward`` (the HF modules in between do not know about them).

The paged attention is plain causal softmax attention (optionally windowed). A layer that hands it
anything more (attention sinks ``s_aux``, logit soft-capping, sparse ``indices``, a position bias)
is refused, never silently ignored: ``attention_call_kwargs`` finds such arguments in the model's
source so that ``engine.model_impl.resolve`` sends the model to plain generate, and
``paged_attention_forward`` raises on any non-None extra it does not know.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface

from engine.attention_metadata import AttentionMetadata
from engine.layers.attention import ATTENTION_BACKENDS

ATTN_IMPLEMENTATION = "switchyard_paged"


@dataclass
class _Step:
    kv_caches: list[torch.Tensor]
    meta: AttentionMetadata | None
    backend: str
    probe: dict[int, tuple[int, int]] | None = field(default=None)  # layer -> (kv heads, head dim)


_STEP: ContextVar[_Step | None] = ContextVar("switchyard_paged_step", default=None)

# Keyword arguments of transformers' attention call that paged_attention_forward implements, or that
# cannot change its result (the engine brings positions, the KV cache and the causal mask itself).
HANDLED_KWARGS = frozenset({"scaling", "dropout", "sliding_window", "softcap"})
IGNORED_KWARGS = frozenset({"position_ids", "use_cache", "cache", "past_key_value", "past_key_values",
                            "cache_position"})


def _check_extras(module: nn.Module, kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if value is None or name in IGNORED_KWARGS:
            continue
        if name == "is_causal" and value is not False:
            continue
        if name == "output_attentions" and not value:
            continue
        what = "attention sinks" if name in ("s_aux", "sinks") else "it"
        raise NotImplementedError(
            f"{type(module).__name__} passes {name!r} to its attention; the engine's paged attention does not "
            f"implement {what}, so this model must be served with plain generate"
        )


@functools.cache
def _module_attention_kwargs(module_name: str) -> frozenset[str]:
    module = sys.modules.get(module_name)
    try:
        tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called == "attention_interface":
            names.update(k.arg for k in node.keywords if k.arg)
    return frozenset(names)


def attention_call_kwargs(model_cls: type) -> frozenset[str]:
    """The keyword names the modeling module of ``model_cls`` passes to its attention function
    (``attention_interface(..., s_aux=self.sinks)`` gives ``s_aux``); empty if its source is unreadable."""
    return _module_attention_kwargs(model_cls.__module__)


def unsupported_attention_kwargs(model_cls: type) -> list[str]:
    """Keyword arguments ``model_cls``'s attention layers pass that the paged attention does not implement."""
    known = HANDLED_KWARGS | IGNORED_KWARGS | {"is_causal", "output_attentions"}
    return sorted(attention_call_kwargs(model_cls) - known)


def paged_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                            sliding_window: int | None = None, softcap: float | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q [1, Hq, T, D], k/v [1, Hkv, T, D] -> ([1, T, Hq, D], None)."""
    step = _STEP.get()
    if step is None:
        raise RuntimeError(f"attention implementation {ATTN_IMPLEMENTATION!r} only runs inside the engine")
    if softcap is not None:
        raise NotImplementedError("attention logit soft-capping is not supported by the paged attention")
    _check_extras(module, kwargs)
    if query.shape[0] != 1:
        raise ValueError("the engine passes its flat batch as a single row")
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        raise TypeError(f"{type(module).__name__} has no layer_idx; it cannot use the paged KV cache")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    if step.probe is not None:
        step.probe[layer] = (k.shape[1], k.shape[2])
        return torch.zeros_like(q).unsqueeze(0), None
    cache = step.kv_caches[layer]
    if tuple(cache.shape[3:]) != tuple(k.shape[1:]):
        raise ValueError(f"layer {layer}: K/V of shape {tuple(k.shape[1:])} do not fit the cache {tuple(cache.shape)}")
    assert step.meta is not None
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = ATTENTION_BACKENDS[step.backend](q, k, v, cache, step.meta, scale, sliding_window)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)


class TransformersForCausalLM(nn.Module):
    """A loaded HF causal LM behind the native model interface:
    ``forward(input_ids [T], positions [T], kv_caches, meta) -> hidden [T, H]`` and
    ``compute_logits(hidden [N, H]) -> float32 [N, V]``."""

    hf: Any  # the transformers PreTrainedModel (its submodules are reached by name)

    def __init__(self, hf_model: nn.Module, attn_backend: str = "torch") -> None:
        super().__init__()
        if attn_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {attn_backend!r}; available: {sorted(ATTENTION_BACKENDS)}")
        self.hf = hf_model
        self.config = hf_model.config
        self.attn_backend = attn_backend
        self.kv_shape = self.measure_kv_shape()  # (num_layers, num_kv_heads, head_dim), read by the engine

    def _base(self, input_ids: torch.Tensor, positions: torch.Tensor, step: _Step) -> torch.Tensor:
        token = _STEP.set(step)
        try:
            out = self.hf.base_model(input_ids=input_ids[None], position_ids=positions[None], use_cache=False,
                                     return_dict=True)
        finally:
            _STEP.reset(token)
        return out.last_hidden_state[0]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        return self._base(input_ids, positions, _Step(kv_caches, meta, self.attn_backend))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head plus the output scalings transformers' heads apply (Cohere, Granite, Gemma 2)."""
        logits = self.hf.get_output_embeddings()(hidden)
        cfg = self.config
        if (scale := getattr(cfg, "logit_scale", None)) is not None:
            logits = logits * scale
        if (divide := getattr(cfg, "logits_scaling", None)) is not None:
            logits = logits / divide
        if cap := getattr(cfg, "final_logit_softcapping", None):
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    @torch.inference_mode()
    def measure_kv_shape(self) -> tuple[int, int, int]:
        """``(num_layers, num_kv_heads, head_dim)`` measured by one probe token through the model."""
        device = next(self.parameters()).device
        probe: dict[int, tuple[int, int]] = {}
        one = torch.zeros(1, dtype=torch.long, device=device)
        self._base(one, one, _Step([], None, self.attn_backend, probe))
        if not probe or sorted(probe) != list(range(len(probe))):
            raise ValueError(f"{type(self.hf).__name__}: attention layers did not report layer indices 0..n-1")
        shapes = set(probe.values())
        if len(shapes) != 1:
            raise ValueError(f"{type(self.hf).__name__}: layers differ in K/V shape {sorted(shapes)}; not supported")
        (heads, dim), = shapes
        return len(probe), heads, dim
