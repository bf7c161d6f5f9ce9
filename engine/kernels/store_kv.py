"""Triton kernel: write this step's K/V rows into their paged-cache slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """One program per token: copy its K and V rows (all KV heads) to ``slot``; skip slot < 0."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, HEADS_PAD)
        d = tl.arange(0, BLOCK_D)
        m = (h < NUM_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=m)
        v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=m)
        dst = (slot * NUM_HEADS + h[:, None]) * HEAD_DIM + d[None, :]
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=m)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k, v ``[T, Hkv, D]`` -> ``kv_cache[0/1]`` (``[num_blocks, block_size, Hkv, D]``) at
    ``slot_mapping`` (int64 [T]; negative = skip)."""
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    _store_kv_kernel[(num_tokens,)](
        k, v, kv_cache[0], kv_cache[1], slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEADS_PAD=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
