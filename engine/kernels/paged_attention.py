"""Triton paged attention for a mixed batch of prefill chunks and decodes.

One program per (sequence, tile of ``BLOCK_Q`` new tokens, KV head). The query heads that share
the KV head (GQA) are packed with the tile's tokens into the ``BLOCK_M = BLOCK_Q * GROUP_PAD`` rows
of one matrix, so each K/V tile is loaded once for all of them. K/V tiles of ``BLOCK_N`` context
positions are gathered through the block table and folded in with an online softmax (base 2).
A prefill chunk attends causally within itself and to all its sequence's earlier cached positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import LOG2E, compute_dtype, dot_precision, interpreting, offset_dtype


@triton.jit(do_not_specialize=["window", "stride_bt"])  # both may change from step to step
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, context_lens_ptr, query_start_ptr,
    scale_log2, window,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, COMPUTE: tl.constexpr, PRECISION: tl.constexpr, OFFSET: tl.constexpr,
):
    s = tl.program_id(0)
    q_tile = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(query_start_ptr + s)
    q_len = tl.load(query_start_ptr + s + 1) - q_start
    if q_tile * BLOCK_Q < q_len:
        ctx = tl.load(context_lens_ptr + s)
        BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
        rows = tl.arange(0, BLOCK_M)
        qi = q_tile * BLOCK_Q + rows // GROUP_PAD
        g = rows % GROUP_PAD
        row_ok = (qi < q_len) & (g < GROUP)
        head = kvh * GROUP + g
        qpos = ctx - q_len + qi  # absolute position of each query row
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        # One 64-bit base per tile, then narrow (OFFSET: int32 where the tensors allow) offsets.
        tile_tok = (q_start + q_tile * BLOCK_Q).to(tl.int64)
        q_rows = ((qi - q_tile * BLOCK_Q) * stride_qt + head * stride_qh).to(OFFSET)
        o_rows = ((qi - q_tile * BLOCK_Q) * stride_ot + head * stride_oh).to(OFFSET)
        q = tl.load(q_ptr + tile_tok * stride_qt + q_rows[:, None] + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(COMPUTE)
        k_base = k_cache_ptr + kvh * HEAD_DIM
        v_base = v_cache_ptr + kvh * HEAD_DIM
        table = block_tables_ptr + s.to(tl.int64) * stride_bt

        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # Keys up to the last query of the tile (causal); from the first one's window start.
        hi = tl.minimum(ctx, ctx - q_len + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len))
        lo = tl.where(window > 0, tl.maximum(0, ctx - q_len + q_tile * BLOCK_Q - window + 1), 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        for start in range(lo, hi, BLOCK_N):
            kpos = start + tl.arange(0, BLOCK_N)
            k_ok = kpos < hi
            blk = tl.load(table + kpos // BLOCK_SIZE, mask=k_ok, other=0).to(OFFSET)
            kv_off = (blk * BLOCK_SIZE + kpos % BLOCK_SIZE) * (NUM_KV_HEADS * HEAD_DIM)
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_base + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(COMPUTE)
            v = tl.load(v_base + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(COMPUTE)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
            allowed = k_ok[None, :] & (kpos[None, :] <= qpos[:, None])
            allowed = allowed & ((window <= 0) | (kpos[None, :] > qpos[:, None] - window))
            scores = tl.where(allowed, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + tile_tok * stride_ot + o_rows[:, None] + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def tile_config(num_heads: int, num_kv_heads: int, head_dim: int, decode: bool = False) -> dict[str, int]:
    """The kernel's tile constants for a head shape (GPU sizes, or small ones under the interpreter).

    Decode-only batches have one token per sequence, so they get the smallest row tile."""
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    if group_pad > 64:
        raise ValueError(f"GQA ratio {group} is above the kernel's limit of 64")
    rows = 16 if interpreting() or decode else 64  # query rows per program (tokens x heads), >= 16 for tl.dot
    return dict(NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
                BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_Q=max(1, rows // group_pad),
                BLOCK_N=16 if interpreting() else (64 if head_dim <= 64 else 32))


def unified_attention(q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor, block_tables: torch.Tensor,
                      context_lens: torch.Tensor, query_start_loc: torch.Tensor, max_query_len: int,
                      scale: float, window: int | None) -> None:
    """Attention of every new token of the batch, written into ``out`` ``[T, Hq, D]``."""
    _, num_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    tiles = tile_config(num_heads, num_kv_heads, head_dim, decode=max_query_len == 1)
    grid = (context_lens.shape[0], triton.cdiv(max_query_len, tiles["BLOCK_Q"]), num_kv_heads)
    _paged_attention_kernel[grid](
        q, kv_cache[0], kv_cache[1], out, block_tables, context_lens, query_start_loc,
        scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        BLOCK_SIZE=block_size, COMPUTE=compute_dtype(q.dtype), PRECISION=dot_precision(q.dtype),
        OFFSET=offset_dtype(kv_cache[0], q, out), **tiles,
    )
