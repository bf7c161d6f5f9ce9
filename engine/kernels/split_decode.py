"""Split-KV (flash-decoding) attention for decode-only batches.

Each (sequence, KV head) context is cut into ``NUM_SPLITS`` chunks, one program each, which write
an unnormalised partial output with its running max and sum; a reduction kernel rescales and adds
them. A batch large enough to fill the GPU on its own gets one split: no partials, no reduction.
The chunk length is computed per sequence inside the kernel, so the launch depends only on the
batch size (what CUDA graphs need), never on context lengths. Decodes have a single query row per
head, so the products are done as broadcast multiply-and-sum in fp32 (no tensor cores needed for a
memory-bound step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import LOG2E, offset_dtype


@triton.jit(do_not_specialize=["window", "stride_bt"])  # both may change from step to step
def _split_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, part_out_ptr, part_m_ptr, part_l_ptr,
    block_tables_ptr, context_lens_ptr, scale_log2, window,
    stride_qt, stride_qh, stride_bt,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    OFFSET: tl.constexpr,
):
    """With ``NUM_SPLITS == 1`` the one split is the whole context: the output is normalised and
    written straight to ``part_out_ptr`` (then the step's output, ``[S, Hq, D]`` contiguous)."""
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + s)
    lo = tl.where(window > 0, tl.maximum(0, ctx - window), 0)
    chunk = tl.cdiv(tl.cdiv(ctx - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    begin = lo + split * chunk
    end = tl.minimum(begin + chunk, ctx)

    g = tl.arange(0, GROUP_PAD)
    g_ok = g < GROUP
    head = kvh * GROUP + g
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + s.to(tl.int64) * stride_qt + (head * stride_qh)[:, None] + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    # One 64-bit base per program, then narrow (OFFSET: int32 where the cache allows) offsets.
    k_base = k_cache_ptr + kvh * HEAD_DIM
    v_base = v_cache_ptr + kvh * HEAD_DIM
    table = block_tables_ptr + s.to(tl.int64) * stride_bt
    m_i = tl.full([GROUP_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for start in range(begin, end, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        k_ok = kpos < end
        blk = tl.load(table + kpos // BLOCK_SIZE, mask=k_ok, other=0).to(OFFSET)
        kv_off = (blk * BLOCK_SIZE + kpos % BLOCK_SIZE) * (NUM_KV_HEADS * HEAD_DIM)
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_base + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], 2) * scale_log2  # [GROUP_PAD, BLOCK_N]
        scores = tl.where(k_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    part = (s * NUM_KV_HEADS * GROUP + head) * NUM_SPLITS + split  # [GROUP_PAD] rows of [S, Hq, SPLITS]
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(part_out_ptr + part.to(tl.int64)[:, None] * HEAD_DIM + d[None, :],
                 out.to(part_out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:
        tl.store(part_m_ptr + part, m_i, mask=g_ok)
        tl.store(part_l_ptr + part, l_i, mask=g_ok)
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _reduce_splits_kernel(
    part_out_ptr, part_m_ptr, part_l_ptr, out_ptr, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """One program per (sequence, query head): combine the partial softmaxes of its splits."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    sp_ok = sp < NUM_SPLITS
    row = (s * NUM_HEADS + h) * NUM_SPLITS + sp
    m = tl.load(part_m_ptr + row, mask=sp_ok, other=-1.0e30)
    l = tl.load(part_l_ptr + row, mask=sp_ok, other=0.0)  # noqa: E741 (the softmax denominator, as in the papers)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    parts = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :],
                    mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(sp_ok, tl.exp2(m - m_max), 0.0)
    total = tl.sum(l * w, 0)
    acc = tl.sum(parts * w[:, None], 0)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + s.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def split_decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, scale: float, window: int | None, num_splits: int) -> None:
    """Decode-only batch (one new token per sequence, token i = sequence i) into ``out``.

    One split writes ``out`` directly (it must then be contiguous; otherwise a temporary is copied
    in); more splits go through fp32 partials and the reduction kernel."""
    num_seqs, num_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    direct = num_splits == 1
    if direct:
        part_out = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        part_m = part_l = part_out  # not written with one split
    else:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_m = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    _split_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, kv_cache[0], kv_cache[1], part_out, part_m, part_l, block_tables, context_lens,
        scale * LOG2E, window or 0, q.stride(0), q.stride(1), block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=triton.next_power_of_2(group), HEAD_DIM=head_dim,
        BLOCK_D=block_d, BLOCK_N=block_size, BLOCK_SIZE=block_size, NUM_SPLITS=num_splits,
        OFFSET=offset_dtype(kv_cache[0]),
    )
    if direct:
        if part_out is not out:
            out.copy_(part_out)
        return
    _reduce_splits_kernel[(num_seqs, num_heads)](
        part_out, part_m, part_l, out, out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d,
        NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
    )
