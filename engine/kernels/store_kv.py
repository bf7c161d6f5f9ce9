"""Triton kernel: write this step's K/V rows into their paged-cache slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (token, kv head): copy a K row and a V row to ``slot``; skip slot < 0."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        d = tl.arange(0, BLOCK_D)
        m = d < HEAD_DIM
        k = tl.load(k_ptr + t.to(tl.int64) * stride_kt + h * stride_kh + d, mask=m)
        v = tl.load(v_ptr + t.to(tl.int64) * stride_vt + h * stride_vh + d, mask=m)
        dst = (slot * NUM_HEADS + h) * HEAD_DIM + d
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=m)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k, v ``[T, Hkv, D]`` (last dim contiguous) -> ``kv_cache[0/1]`` at ``slot_mapping`` (int64 [T])."""
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    _store_kv_kernel[(num_tokens, num_heads)](
        k, v, kv_cache[0], kv_cache[1], slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
    )
