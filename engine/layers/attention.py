"""Paged attention: write this step's K/V into the block cache, then attend through block tables.

The KV cache of one layer is ONE tensor ``[2, num_blocks, block_size, num_kv_heads, head_dim]``
(0 = K, 1 = V). ``AttentionMetadata`` describes a flat batch of sequences laid out one after the
other; a sequence's new tokens are the last ``query_len`` positions of its context.

The pure-torch path is vectorised over the batch: sequences are split into decodes
(query_len == 1) and prefill chunks, and for each group the context K/V of every sequence is
gathered through the block tables into a padded tensor and attended with a boolean-masked
``scaled_dot_product_attention`` (GQA folded into the query axis). The index maps and masks are
built once per step (cached on the metadata) and shared by all layers.

The "cpu" backend is the same path with the decode rows handed to a C++ kernel
(``engine.cpu_kernels``) that reads K/V in place through the block tables: on the CPU, decode
attention is bound by memory traffic, and the gather plus padding multiply it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention_metadata import AttentionMetadata
from engine.cpu_kernels import paged_decode


@dataclass
class _Group:
    """Sequences attended together: their new tokens padded to ``[num_seqs, q_len]``."""

    num_seqs: int
    q_len: int
    tokens: torch.Tensor  # [Tg] indices into the flat batch
    pad_index: torch.Tensor  # [Tg] indices into the padded num_seqs * q_len rows
    blocks: torch.Tensor  # [Sg * Bg] cache block of every context block (clamped where masked)
    mask: torch.Tensor  # [Sg, 1, q_len, Bg * block_size] True = may attend
    identity: bool = False  # the group is the whole batch in order, unpadded: no gather/scatter needed
    masks: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def mask_for(self, group_size: int, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask (0 / -inf) with the query axis repeated per query head of a KV head,
        built once per step and shared by every layer."""
        key = (group_size, dtype)
        m = self.masks.get(key)
        if m is None:
            s, _, q, L = self.mask.shape
            allowed = self.mask[:, :, None].expand(s, 1, group_size, q, L).reshape(s, 1, group_size * q, L)
            m = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
            self.masks[key] = m
        return m


@dataclass
class _DecodeRows:
    """Decode rows (one query token each) for a kernel that reads the block cache in place."""

    tokens: torch.Tensor | None  # [Sd] indices into the flat batch (None: the batch is these rows, in order)
    block_tables: torch.Tensor  # int32 [Sd, W]
    context_lens: torch.Tensor  # int32 [Sd]


@dataclass
class _TorchPlan:
    write_tokens: torch.Tensor | None  # tokens whose slot >= 0 (None: all of them)
    write_slots: torch.Tensor
    groups: list[_Group]  # padded groups attended with scaled_dot_product_attention
    decodes: _DecodeRows | None = None  # decode rows left to the CPU kernel (the "cpu" backend)


def _build_group(meta: AttentionMetadata, sel: torch.Tensor, q_host: list[int], c_host: list[int],
                 window: int | None) -> _Group:
    dev = meta.context_lens.device
    qsl = meta.query_start_loc.long()
    ql = (qsl[1:] - qsl[:-1])[sel]
    cl = meta.context_lens.long()[sel]
    s, q_max = len(q_host), max(q_host)
    bs = meta.block_size
    n_blocks = -(-max(c_host) // bs)
    l_max = n_blocks * bs  # whole blocks are gathered; columns past a context length are masked
    rows = torch.arange(q_max, device=dev)
    valid = rows[None, :] < ql[:, None]
    tokens = (qsl[:-1][sel][:, None] + rows[None, :])[valid]
    pad_index = (torch.arange(s, device=dev)[:, None] * q_max + rows[None, :])[valid]
    cols = torch.arange(l_max, device=dev)
    qpos = (cl - ql)[:, None] + rows[None, :]  # absolute position of each (padded) query row
    mask = (cols[None, None, :] <= qpos[:, :, None]) & (cols[None, None, :] < cl[:, None, None])
    if window is not None:
        mask &= cols[None, None, :] > qpos[:, :, None] - window
    blocks = meta.block_tables[sel][:, :n_blocks].long().clamp(min=0)
    return _Group(s, q_max, tokens, pad_index, blocks.reshape(-1), mask[:, None])


def _build_plan(meta: AttentionMetadata, window: int | None, kernel_decodes: bool = False) -> _TorchPlan:
    """Index maps for one step. With ``kernel_decodes`` the decode rows are not padded into a
    group but described for ``engine.cpu_kernels.paged_decode``."""
    slot = meta.slot_mapping.long()
    keep = slot >= 0
    if meta.all_slots_valid or bool(keep.all()):
        write_tokens, write_slots = None, slot
    else:
        write_tokens = keep.nonzero().squeeze(1)
        write_slots = slot[write_tokens]
    qsl = meta.query_start_loc.long()
    q_lens = meta.query_lens_host if meta.query_lens_host is not None else (qsl[1:] - qsl[:-1]).tolist()
    c_lens = meta.context_lens_host if meta.context_lens_host is not None else meta.context_lens.tolist()
    plan = _TorchPlan(write_tokens, write_slots, [])
    for want_decode in (True, False):
        idx = [i for i, q in enumerate(q_lens) if (q == 1) == want_decode and q > 0]
        if not idx:
            continue
        if want_decode and kernel_decodes:
            if len(idx) == len(q_lens) == len(slot):
                plan.decodes = _DecodeRows(None, meta.block_tables, meta.context_lens)
            else:
                sel = torch.tensor(idx, device=slot.device)
                plan.decodes = _DecodeRows(qsl[:-1][sel], meta.block_tables[sel], meta.context_lens[sel])
            continue
        sel = torch.tensor(idx, device=slot.device)
        plan.groups.append(_build_group(meta, sel, [q_lens[i] for i in idx], [c_lens[i] for i in idx], window))
    # One sequence, or decodes only, covering the whole flat batch: padded rows are the tokens.
    groups = plan.groups
    if plan.decodes is None and len(groups) == 1 and (len(q_lens) == 1 or groups[0].q_len == 1):
        groups[0].identity = min(q_lens) > 0 and len(slot) == sum(q_lens)
    return plan


def _write_kv(plan: _TorchPlan, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> None:
    _, _, _, h_kv, d = kv_cache.shape
    k_flat = kv_cache[0].view(-1, h_kv, d)
    v_flat = kv_cache[1].view(-1, h_kv, d)
    if k.dtype != kv_cache.dtype:
        k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)
    if plan.write_tokens is not None:
        k, v = k[plan.write_tokens], v[plan.write_tokens]
    k_flat.index_copy_(0, plan.write_slots, k)
    v_flat.index_copy_(0, plan.write_slots, v)


def _attend_groups(q: torch.Tensor, kv_cache: torch.Tensor, groups: list[_Group], scale: float,
                   out: torch.Tensor | None) -> torch.Tensor:
    """Attend every padded group, scattering its rows into ``out`` (made here when None)."""
    if out is None and len(groups) == 1 and groups[0].identity:
        return _attend(q, kv_cache, groups[0], scale)
    if out is None:
        out = q.new_zeros(q.shape)
    for grp in groups:
        qp = q.new_zeros(grp.num_seqs * grp.q_len, *q.shape[1:])
        qp[grp.pad_index] = q[grp.tokens]
        out[grp.tokens] = _attend(qp, kv_cache, grp, scale)[grp.pad_index]
    return out


def torch_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float, window: int | None) -> torch.Tensor:
    key = ("torch", window)
    plan = meta.plans.get(key)
    if plan is None:
        plan = meta.plans[key] = _build_plan(meta, window)
    _write_kv(plan, k, v, kv_cache)
    return _attend_groups(q, kv_cache, plan.groups, scale, None)


def cpu_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float, window: int | None) -> torch.Tensor:
    """The torch path with decode rows handed to the C++ kernel (``engine.cpu_kernels``), which
    reads K/V in place instead of gathering and padding every context."""
    key = ("cpu", window)
    plan = meta.plans.get(key)
    if plan is None:
        plan = meta.plans[key] = _build_plan(meta, window, kernel_decodes=True)
    _write_kv(plan, k, v, kv_cache)
    rows = plan.decodes
    if rows is None:
        return _attend_groups(q, kv_cache, plan.groups, scale, None)
    if rows.tokens is None:
        return paged_decode(q, kv_cache, rows.block_tables, rows.context_lens, scale, window)
    out = _attend_groups(q, kv_cache, plan.groups, scale, q.new_zeros(q.shape))
    out[rows.tokens] = paged_decode(q[rows.tokens], kv_cache, rows.block_tables, rows.context_lens, scale, window)
    return out


def _attend(qp: torch.Tensor, kv_cache: torch.Tensor, grp: _Group, scale: float) -> torch.Tensor:
    """Padded queries ``[Sg * q_len, Hq, D]`` of one group -> their outputs, same shape."""
    s, ql = grp.num_seqs, grp.q_len
    _, h_q, d = qp.shape
    _, num_blocks, _, h_kv, _ = kv_cache.shape
    g = h_q // h_kv
    # GQA: the query heads of one KV head become extra query rows, so K/V need no repeat.
    qp = qp.reshape(s, ql, h_kv, g, d).permute(0, 2, 3, 1, 4).reshape(s, h_kv, g * ql, d)
    # One gather of whole blocks for K and V together (a block is one contiguous row).
    kv = kv_cache.view(2, num_blocks, -1).index_select(1, grp.blocks).view(2, s, -1, h_kv, d).to(qp.dtype)
    kc, vc = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [Sg, Hkv, Lg, D]
    o = F.scaled_dot_product_attention(qp, kc, vc, attn_mask=grp.mask_for(g, qp.dtype), scale=scale)
    return o.view(s, h_kv, g, ql, d).permute(0, 3, 1, 2, 4).reshape(s * ql, h_q, d)


def _triton_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                            meta: AttentionMetadata, scale: float, window: int | None) -> torch.Tensor:
    """Imports the kernels on first use: Triton fixes interpreter vs GPU mode at import time."""
    from engine.kernels import interpreting, triton_paged_attention

    if q.device.type != "cuda" and not interpreting():
        raise RuntimeError("attn_backend='triton' needs a CUDA device (on CPU only under TRITON_INTERPRET=1)")

    return triton_paged_attention(q, k, v, kv_cache, meta, scale, window)


AttentionFn = Callable[..., torch.Tensor]
ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "torch": torch_paged_attention,
    "cpu": cpu_paged_attention,
    "triton": _triton_paged_attention,
}


class PagedAttention(nn.Module):
    """``forward(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], kv_cache, meta) -> [T, Hq, D]``.

    ``backend`` names an entry of ``ATTENTION_BACKENDS``: "torch" (the reference), "cpu" (the
    reference with C++ decode attention; ``EngineConfig`` picks it on CPU when it builds) or
    "triton" (``engine.kernels``; on CPU only under ``TRITON_INTERPRET=1``). ``sliding_window``
    limits each query to the last ``window`` keys (Mistral), as transformers masks it.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        backend: str = "torch",
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; available: {sorted(ATTENTION_BACKENDS)}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.backend = backend

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        fn = ATTENTION_BACKENDS[self.backend]
        return fn(q, k, v, kv_cache, meta, self.scale, self.sliding_window)
