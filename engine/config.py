"""Engine configuration: one dataclass, validated once at construction."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map a vLLM-style dtype name ("float32", "bfloat16", "float16") or a torch dtype to one of
    the dtypes the engine runs in; raise ValueError for any other."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use float32, bfloat16 or float16") from None


def checkpoint_dtype(model: str) -> torch.dtype | None:
    """The dtype a Hugging Face folder's ``config.json`` declares (``torch_dtype`` or ``dtype``)."""
    path = Path(model).expanduser() / "config.json"
    try:
        fields = json.loads(path.read_text())
        return parse_dtype(str(fields.get("torch_dtype") or fields.get("dtype")))
    except (OSError, ValueError, AttributeError):
        return None


def auto_dtype(on_gpu: bool, checkpoint: torch.dtype | None, bf16_supported: bool = True) -> torch.dtype:
    """``dtype: auto``: float32 on the CPU; on a GPU the checkpoint's half dtype, and bfloat16 for a
    float32 (or undeclared) checkpoint, as vLLM does; float16 where the GPU has no bfloat16."""
    if not on_gpu:
        return torch.float32
    chosen = checkpoint if checkpoint in (torch.bfloat16, torch.float16) else torch.bfloat16
    return torch.float16 if chosen == torch.bfloat16 and not bf16_supported else chosen


def resolve_dtype(dtype: str | torch.dtype, device: str, model: str) -> torch.dtype:
    """A dtype name or ``auto`` (see ``auto_dtype``) -> the dtype the engine runs in."""
    if not (isinstance(dtype, str) and dtype.lower() == "auto"):
        return parse_dtype(dtype)
    if not device.startswith("cuda"):
        return auto_dtype(False, None)
    return auto_dtype(True, checkpoint_dtype(model), torch.cuda.is_bf16_supported())


ATTN_BACKENDS = ("auto", "torch", "cpu", "triton")
DEFAULT_MAX_NUM_SEQS = 256  # sequences in one batch, unless the token budget per step is smaller


def triton_available() -> bool:
    """Triton imports and can build its launcher (it needs a C compiler: ``$CC``, gcc or clang)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return any(shutil.which(c) for c in (os.environ.get("CC", ""), "gcc", "cc", "clang") if c)


def resolve_attn_backend(name: str, device: str) -> str:
    """``auto`` is "triton" on CUDA (what CUDA graphs need) when Triton imports; on the CPU it is
    "cpu" (C++ decode attention) when its kernels build, else "torch". Asking for "cpu" where they
    cannot build is an error that says why."""
    if name not in ATTN_BACKENDS:
        raise ValueError(f"attn_backend must be one of {', '.join(ATTN_BACKENDS)} (got {name!r})")
    if name == "auto" and device.startswith("cuda"):
        return "triton" if triton_available() else "torch"
    if name not in ("auto", "cpu"):
        return name
    on_cpu = device == "cpu"
    if name == "cpu" and not on_cpu:
        raise ValueError(f"attn_backend='cpu' runs on the CPU, not on {device!r}")
    from engine import cpu_kernels

    if on_cpu and cpu_kernels.available():
        return "cpu"
    if name == "cpu":
        raise ValueError(f"attn_backend='cpu' is unavailable: {cpu_kernels.build_error()}")
    return "torch"


@dataclass
class EngineConfig:
    """Everything the engine needs to size its cache and schedule.

    On CUDA the number of KV blocks comes from ``gpu_memory_utilization`` (vLLM's rule); on CPU
    set ``kv_cache_bytes`` or ``num_kv_blocks`` (``num_kv_blocks`` wins when both are set).
    ``max_model_len`` defaults to the model's ``max_position_embeddings``.
    """

    model: str
    dtype: str | torch.dtype = "auto"  # auto | float32 | bfloat16 | float16 (see resolve_dtype)
    device: str = "cpu"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    num_kv_blocks: int | None = None
    max_num_seqs: int = 0  # 0: DEFAULT_MAX_NUM_SEQS, or max_num_batched_tokens where that is fewer
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    attn_backend: str = "auto"  # auto | torch | cpu | triton (see resolve_attn_backend)
    enforce_eager: bool = False  # no CUDA graphs for decode steps (engine.cuda_graphs)
    model_impl: str = "auto"  # auto | native | transformers (engine.model_impl.resolve)
    seed: int = 0

    def __post_init__(self) -> None:
        self.torch_dtype = resolve_dtype(self.dtype, self.device, self.model)
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_num_seqs < 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        self.max_num_seqs = self.max_num_seqs or min(DEFAULT_MAX_NUM_SEQS, self.max_num_batched_tokens)
        if self.max_num_batched_tokens < self.max_num_seqs:  # as vLLM: each running sequence's decode needs a token
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs}): each running sequence needs a token of every step's budget; "
                             "raise max_num_batched_tokens or lower max_num_seqs")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError("num_kv_blocks must be positive")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError("kv_cache_bytes must be positive")
        if self.scheduling_policy not in ("fcfs", "priority", "fair"):
            raise ValueError("scheduling_policy must be 'fcfs', 'priority' or 'fair' (weighted fair across tenants)")
        self.attn_backend = resolve_attn_backend(self.attn_backend, self.device)
        if self.attn_backend == "triton" and not self.device.startswith("cuda"):
            from engine.kernels.common import interpreting

            if not interpreting():
                raise ValueError("attn_backend='triton' needs a CUDA device (on CPU only under TRITON_INTERPRET=1)")

    def resolve_max_model_len(self, model_max_len: int) -> int:
        """Fix ``max_model_len`` against the model's limit and check the token budget."""
        if self.max_model_len is None:
            self.max_model_len = model_max_len
        elif self.max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's "
                f"max_position_embeddings={model_max_len}"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len}); raise it or lower max_model_len"
            )
        return self.max_model_len
