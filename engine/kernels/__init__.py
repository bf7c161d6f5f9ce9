"""Triton kernels for paged attention (the "triton" attention backend).

- ``store_kv``: this step's K/V rows into their cache slots (negative slot = skip);
- ``unified_attention``: mixed prefill chunks + decodes, GQA heads packed per program;
- ``split_decode_attention``: every decode-only batch (flash-decoding with a reduction kernel when
  the batch is too small to fill the GPU, one split writing the output directly otherwise).

Import this package only when the Triton path is wanted: Triton decides at decoration time whether
it interprets (``TRITON_INTERPRET=1``, CPU tensors) or compiles for the GPU.
"""

from __future__ import annotations

import torch

from engine.attention_metadata import AttentionMetadata
from engine.kernels.common import interpreting, num_sms
from engine.kernels.paged_attention import unified_attention
from engine.kernels.split_decode import split_decode_attention
from engine.kernels.store_kv import store_kv

MAX_SPLITS = 16


def decode_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """How many KV splits a decode batch gets: enough programs for about two waves of the GPU's
    SMs. Depends only on the batch shape, so a CUDA graph captured at a batch size stays valid."""
    programs = num_seqs * num_kv_heads
    return max(1, min(MAX_SPLITS, (2 * num_sms(device)) // max(1, programs)))


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attend the new tokens ``q [T, Hq, D]`` over the cache (already holding this step's K/V).

    Decode-only batches (``max_query_len == 1``) take the split-KV kernel with ``num_splits`` (by
    default ``decode_splits``; 1 = no reduction pass); everything else takes the unified kernel.
    """
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0:
        return out
    num_seqs = meta.context_lens.shape[0]
    if meta.max_query_len == 1 and q.shape[0] == num_seqs:
        splits = num_splits if num_splits is not None else decode_splits(num_seqs, kv_cache.shape[3], q.device)
        split_decode_attention(q, kv_cache, out, meta.block_tables, meta.context_lens, scale, window, max(1, splits))
        return out
    unified_attention(
        q, kv_cache, out, meta.block_tables, meta.context_lens, meta.query_start_loc, meta.max_query_len, scale, window
    )
    return out


def triton_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """The ``ATTENTION_BACKENDS["triton"]`` entry: store K/V, then attend."""
    store_kv(k, v, kv_cache, meta.slot_mapping)
    return paged_attention(q, kv_cache, meta, scale, window)


__all__ = [
    "decode_splits",
    "interpreting",
    "paged_attention",
    "split_decode_attention",
    "store_kv",
    "triton_paged_attention",
    "unified_attention",
]
