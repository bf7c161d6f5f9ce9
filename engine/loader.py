"""Load a native model from a local Hugging Face folder (config.json + *.safetensors).

The model is built on the meta device and materialised directly in the requested dtype and
device, so no time is spent on random initialisation; every parameter is then filled from the
checkpoint (``load_weights`` raises if one is missing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig

from engine import gguf_file
from engine.config import parse_dtype
from engine.models import MODEL_REGISTRY, resolve_architecture
from engine.models.llama import head_dim_of
from engine.weight_files import ModelLoadError, safetensors_files

__all__ = ["ModelLoadError", "iter_weights", "load_config", "load_model", "model_kv_shape", "safetensors_files"]


def load_config(model_path: str | Path) -> Any:
    if gguf_file.is_gguf(model_path):
        return gguf_file.load_config(model_path)
    path = Path(model_path)
    if not path.is_dir():
        raise ModelLoadError(f"model folder {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model folder {str(path)!r} has no config.json")
    return AutoConfig.from_pretrained(str(path), local_files_only=True)


def iter_weights(model_path: str | Path, hf_config: Any = None,
                 dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors by Hugging Face name (a GGUF file's dequantized into ``dtype``)."""
    if gguf_file.is_gguf(model_path):
        yield from gguf_file.iter_weights(model_path, hf_config, dtype)
        return
    for file in safetensors_files(model_path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@contextlib.contextmanager
def _initialisers_skipped() -> Iterator[None]:
    """``torch.nn.init``'s initialisers as no-ops while the model is built on the meta device: every
    parameter is overwritten from the checkpoint, and on meta tensors they run through torch's
    Python reference kernels, whose first use imports torch._dynamo and triton (about 150 MB)."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_") and callable(getattr(nn.init, n))]
    saved = {n: getattr(nn.init, n) for n in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _to_empty(model: nn.Module, device: torch.device | str) -> None:
    """``model.to_empty(device=device)`` (uninitialised storage for every parameter and buffer)
    without torch's reference ``empty_like`` for meta tensors, whose first use imports sympy (~35 MB)."""
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                fresh = torch.empty(param.shape, dtype=param.dtype, device=device)
                module._parameters[name] = nn.Parameter(fresh, requires_grad=param.requires_grad)
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)


def load_model(model_path: str | Path, dtype: torch.dtype | str = torch.float32,
               device: torch.device | str = "cpu", attn_backend: str = "torch") -> tuple[nn.Module, Any]:
    """``(model in eval mode on device, hf_config)`` for a local HF folder."""
    hf_config = load_config(model_path)
    cls = resolve_architecture(hf_config)
    if cls is None:
        raise ModelLoadError(
            f"unsupported architecture {getattr(hf_config, 'architectures', None)}; "
            f"native models: {sorted(MODEL_REGISTRY)}"
        )
    dtype = parse_dtype(dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"), _initialisers_skipped():
            model = cls(hf_config, attn_backend=attn_backend)
    finally:
        torch.set_default_dtype(previous)
    _to_empty(model, device)
    native: Any = model  # a native model class: lm_head, model.embed_tokens, load_weights
    if getattr(native, "tie_word_embeddings", False):
        native.lm_head.weight = native.model.embed_tokens.weight  # _to_empty unties shared parameters
    native.load_weights(iter_weights(model_path, hf_config, dtype))
    return model.eval(), hf_config


def model_kv_shape(hf_config: Any) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of the KV cache the model needs."""
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    return hf_config.num_hidden_layers, kv_heads, head_dim_of(hf_config)
