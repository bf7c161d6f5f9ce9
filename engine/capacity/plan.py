"""Capacity planning from a model's config alone: weights, KV bytes per token, what fits.

``plan_capacity`` answers "how many tokens / sequences can this GPU hold for this model" without
loading anything: parameters are counted from the safetensors headers when the folder has them,
else from the architecture's shapes in config.json. Memory is in decimal GB as GPUs are sold
(80 GB = 80e9 bytes); activations and CUDA graphs are not subtracted (the engine measures those at
startup, so the live cache comes out a little smaller).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.capacity.kv import Capacity, KVLayout, blocks_for
from engine.config import auto_dtype, parse_dtype
from engine.weight_files import ModelLoadError, safetensors_files


@dataclass(frozen=True)
class CapacityPlan:
    architecture: str
    dtype: torch.dtype
    num_params: int
    weights_bytes: int
    layout: KVLayout
    budget_bytes: int
    capacity: Capacity
    max_model_len: int
    reserve_cap: int
    avg_tokens: int

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layout.bytes_per_token

    @property
    def tokens(self) -> int:
        return self.capacity.tokens

    def sequences(self, reserved_tokens: int) -> int:
        """Sequences that fit when each holds ``reserved_tokens`` (rounded up to whole blocks)."""
        return self.capacity.num_blocks // blocks_for(max(1, reserved_tokens), self.capacity.block_size)

    @property
    def seqs_full_context(self) -> int:
        return self.sequences(self.max_model_len)

    @property
    def seqs_capped(self) -> int:
        return self.sequences(min(self.reserve_cap, self.max_model_len))

    @property
    def seqs_paged(self) -> int:
        return self.sequences(min(self.avg_tokens, self.max_model_len))


def read_config(model: str | Path) -> tuple[dict[str, Any], Path | None]:
    """config.json of a HF folder (or the file itself) -> (config dict, folder or None)."""
    path = Path(model)
    folder = path if path.is_dir() else None
    file = path / "config.json" if folder else path
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no config.json at {file}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not valid JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a JSON object")
    return config.get("text_config", config) if "num_hidden_layers" not in config else config, folder


def _int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"config.json: {key!r} must be a positive integer (got {value!r})")
    return value


def head_dim_of(config: dict[str, Any]) -> int:
    if config.get("head_dim"):
        return _int(config, "head_dim")
    return _int(config, "hidden_size") // _int(config, "num_attention_heads")


def count_params_from_config(config: dict[str, Any]) -> int:
    """Parameters of a Llama-family decoder (Llama, Mistral, Qwen2 with qkv bias, Qwen3 q/k norms)."""
    h, layers = _int(config, "hidden_size"), _int(config, "num_hidden_layers")
    heads, vocab, inter = (
        _int(config, "num_attention_heads"),
        _int(config, "vocab_size"),
        _int(config, "intermediate_size"),
    )
    kv_heads = _int(config, "num_key_value_heads", heads)
    d = head_dim_of(config)
    model_type = config.get("model_type", "")
    attn = h * heads * d + 2 * h * kv_heads * d + heads * d * h
    if config.get("attention_bias") or model_type == "qwen2":
        attn += heads * d + 2 * kv_heads * d
    if model_type == "qwen3":
        attn += 2 * d  # q_norm, k_norm
    mlp = 3 * h * inter + (2 * inter + h if config.get("mlp_bias") else 0)
    per_layer = attn + mlp + 2 * h
    embed = vocab * h
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    return embed + layers * per_layer + h + head


def count_params_from_safetensors(folder: Path) -> int | None:
    """Sum of tensor sizes in the folder's safetensors headers (no tensor data is read)."""
    try:
        files = safetensors_files(folder)
    except ModelLoadError:
        return None
    total = 0
    for file in files:
        with file.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for dim in info["shape"]:
                    n *= dim
                total += n
    return total


def gpu_dtype(dtype: str | None, declared: object) -> torch.dtype:
    """The dtype the engine runs the model in on a GPU: ``dtype``, or for None / "auto" the
    engine's ``dtype: auto`` rule on the checkpoint's declared dtype."""
    if dtype is not None and dtype.lower() != "auto":
        return parse_dtype(dtype)
    try:
        found = parse_dtype(str(declared)) if declared else None
    except ValueError:
        found = None
    return auto_dtype(True, found)


def plan_capacity(
    model: str | Path,
    gpu_memory_gb: float,
    gpu_memory_utilization: float = 0.9,
    dtype: str | None = None,
    block_size: int = 16,
    avg_tokens: int = 2000,
    max_model_len: int | None = None,
    reserve_cap: int = 8192,
) -> CapacityPlan:
    if gpu_memory_gb <= 0:
        raise ValueError("--gpu-memory-gb must be positive")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError("--gpu-memory-utilization must be in (0, 1]")
    if min(block_size, avg_tokens, reserve_cap) <= 0 or (max_model_len is not None and max_model_len <= 0):
        raise ValueError("block size, token counts and max model length must be positive")
    config, folder = read_config(model)
    torch_dtype = gpu_dtype(dtype, config.get("torch_dtype") or config.get("dtype"))
    layout = KVLayout(
        _int(config, "num_hidden_layers"),
        _int(config, "num_key_value_heads", _int(config, "num_attention_heads")),
        head_dim_of(config),
        torch_dtype,
    )
    params = (count_params_from_safetensors(folder) if folder else None) or count_params_from_config(config)
    weights = params * torch.empty((), dtype=torch_dtype).element_size()
    budget = int(gpu_memory_gb * 1e9 * gpu_memory_utilization)
    if weights >= budget:
        raise ValueError(
            f"the weights alone ({weights / 1e9:.2f} GB) exceed the memory budget "
            f"({budget / 1e9:.2f} GB = {gpu_memory_gb:g} GB x {gpu_memory_utilization:g})"
        )
    model_len = max_model_len or _int(config, "max_position_embeddings", 2048)
    capacity = Capacity(layout, layout.blocks_in(budget - weights, block_size), block_size)
    archs = config.get("architectures") or [config.get("model_type", "?")]
    return CapacityPlan(
        str(archs[0]), torch_dtype, params, weights, layout, budget, capacity, model_len, reserve_cap, avg_tokens
    )


def format_plan(plan: CapacityPlan, gpu_memory_gb: float, utilization: float) -> str:
    lay = plan.layout
    elem = plan.kv_bytes_per_token // (2 * lay.num_layers * lay.num_kv_heads * lay.head_dim)
    dtype = str(plan.dtype).removeprefix("torch.")
    cap = plan.capacity
    rows = [
        ("model", f"{plan.architecture}, {dtype}"),
        ("weights", f"{plan.weights_bytes / 1e9:.2f} GB ({plan.num_params:,} parameters)"),
        (
            "KV per token",
            f"{plan.kv_bytes_per_token / 1024:g} KiB (2 x {lay.num_layers} layers x "
            f"{lay.num_kv_heads} KV heads x {lay.head_dim} head dim x {elem} bytes)",
        ),
        ("memory budget", f"{plan.budget_bytes / 1e9:.2f} GB ({gpu_memory_gb:g} GB x {utilization:g})"),
        ("KV cache", f"{cap.bytes / 1e9:.2f} GB = {cap.num_blocks:,} blocks x {cap.block_size} tokens"),
        ("tokens that fit", f"{plan.tokens:,}"),
        ("sequences, full-context reservation", f"{plan.seqs_full_context:,} (x {plan.max_model_len:,} tokens)"),
        (
            "sequences, capped reservation",
            f"{plan.seqs_capped:,} (x {min(plan.reserve_cap, plan.max_model_len):,} tokens)",
        ),
        (
            "sequences, paged allocation",
            f"{plan.seqs_paged:,} (avg {min(plan.avg_tokens, plan.max_model_len):,} tokens)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("(activations and CUDA graphs not subtracted; the engine measures them at startup)")
    return "\n".join(lines)


def plan_as_dict(plan: CapacityPlan) -> dict[str, Any]:
    return {
        "architecture": plan.architecture,
        "dtype": str(plan.dtype).removeprefix("torch."),
        "num_params": plan.num_params,
        "weights_bytes": plan.weights_bytes,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "budget_bytes": plan.budget_bytes,
        "num_blocks": plan.capacity.num_blocks,
        "block_size": plan.capacity.block_size,
        "tokens": plan.tokens,
        "max_model_len": plan.max_model_len,
        "sequences": {"full_context": plan.seqs_full_context, "capped": plan.seqs_capped, "paged": plan.seqs_paged},
    }
