"""Load the model an ``EngineConfig`` names with the implementation ``model_impl`` resolves to."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.gguf_file import is_gguf
from engine.model_impl.resolve import ModelImplError, Resolution, inspect_model, resolve_model_impl

log = logging.getLogger("switchyard.engine")


@dataclass
class LoadedModel:
    model: nn.Module
    hf_config: Any
    kv_shape: tuple[int, int, int]  # (num_layers, num_kv_heads, head_dim)
    resolution: Resolution


def load_transformers_model(folder: str | Path, dtype: torch.dtype, device: torch.device | str,
                            attn_backend: str = "torch") -> tuple[nn.Module, Any]:
    """An HF causal LM with the engine's paged attention, wrapped as a native-interface model."""
    import transformers

    from engine.model_impl.hf_model import ATTN_IMPLEMENTATION, TransformersForCausalLM

    source = Path(folder)
    where = {"gguf_file": source.name} if is_gguf(source) else {}  # transformers dequantizes the file itself
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(source.parent if where else source), dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION,
        local_files_only=True, **where,
    )
    hf_model.to(device).eval()  # type: ignore[arg-type]  # transformers' stub of .to
    return TransformersForCausalLM(hf_model, attn_backend), hf_model.config


def load_engine_model(model: str, dtype: torch.dtype, device: str, attn_backend: str = "torch",
                      model_impl: str = "auto") -> LoadedModel:
    """Resolve ``model_impl`` for the folder ``model``, log the choice and load it for the engine.

    Raises ModelImplError when the choice cannot run inside the engine (``native`` on an
    unsupported architecture, or a model only plain ``generate`` can serve).
    """
    from engine.loader import load_model, model_kv_shape

    resolution = resolve_model_impl(inspect_model(model), model_impl)
    if resolution.impl == "generate":
        raise ModelImplError(
            f"{resolution.architecture} cannot run inside the engine ({resolution.reason}); "
            "serve it with the 'transformers' provider (plain generate)"
        )
    log.info("engine model %s -> %s", model, resolution.describe())
    if resolution.impl == "native":
        native, hf_config = load_model(model, dtype, device, attn_backend)
        return LoadedModel(native, hf_config, model_kv_shape(hf_config), resolution)
    wrapped, hf_config = load_transformers_model(model, dtype, device, attn_backend)
    return LoadedModel(wrapped, hf_config, wrapped.kv_shape, resolution)  # type: ignore[arg-type]
