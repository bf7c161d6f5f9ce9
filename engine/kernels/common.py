"""Shared pieces of the Triton kernels: dtype mapping, interpreter detection, tile choices."""

from __future__ import annotations

import os
from functools import cache

import torch
import triton.language as tl

LOG2E = 1.4426950408889634

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels then run on CPU tensors through numpy)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def compute_dtype(dtype: torch.dtype) -> tl.dtype:
    """The dtype the kernels feed their dot products with.

    On a GPU: the storage dtype (fp16/bf16 tensor cores, fp32 accumulation). Under the interpreter
    everything is upcast to fp32 first, because this Triton's interpreter stores bf16 as raw uint16
    and only converts it correctly through an explicit cast (arithmetic on it is wrong).
    """
    if dtype not in _TL_DTYPES:
        raise TypeError(f"the Triton attention kernels support float16, bfloat16 and float32, not {dtype}")
    return tl.float32 if interpreting() else _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str | None:
    """fp32 inputs get exact IEEE dots (no TF32), so float32 runs match the torch reference;
    fp16/bf16 dots keep Triton's default."""
    return "ieee" if dtype == torch.float32 or interpreting() else None


@cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the device (asked once per device)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a pretend GPU, so the split-KV path is exercised on small batches


def offset_dtype(*tensors: torch.Tensor) -> tl.dtype:
    """int32 element offsets when every tensor a kernel indexes has fewer than 2**31 elements (fewer
    registers than 64-bit ones: a tile's offsets are taken from one 64-bit base), else int64."""
    return tl.int32 if all(t.numel() < 2**31 for t in tensors) else tl.int64
