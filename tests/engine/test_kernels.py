"""Triton kernels (interpreter mode, CPU tensors) against the torch reference attention path.

Inputs are random on every run; outputs are poisoned with NaN before each kernel launch, and so are
the cache slots no sequence owns, so a kernel that reads or skips the wrong places fails loudly.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton's jit (decided at decoration)

import pytest
import torch

from engine.attention_metadata import AttentionMetadata
from engine.kernels import paged_attention, store_kv
from engine.layers.attention import torch_paged_attention

BS = 16
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


class PagedBatch:
    """Sequences (cached, new) with their cached prefix already in shuffled cache blocks."""

    def __init__(self, specs: list[tuple[int, int]], h_q: int, h_kv: int, d: int, dtype: torch.dtype) -> None:
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        total_blocks = sum(-(-(c + n) // BS) for c, n in specs) + 3
        free = torch.randperm(total_blocks, generator=gen).tolist()
        width = max(-(-(c + n) // BS) for c, n in specs) + 1  # one padding column
        shape = (2, total_blocks, BS, h_kv, d)
        self.clean = torch.zeros(shape, dtype=dtype)
        self.poisoned = torch.full(shape, float("nan"), dtype=dtype)
        tables, slots, qs, ks, vs = [], [], [], [], []
        for cached, new in specs:
            blocks = [free.pop() for _ in range(-(-(cached + new) // BS))]
            tables.append(blocks + [-1] * (width - len(blocks)))
            pos = torch.tensor([blocks[p // BS] * BS + p % BS for p in range(cached + new)], dtype=torch.long)
            kv = torch.randn(2, cached + new, h_kv, d, generator=gen).to(dtype)
            for cache in (self.clean, self.poisoned):
                cache.view(2, -1, h_kv, d)[:, pos[:cached]] = kv[:, :cached]
            slots.append(pos[cached:])
            ks.append(kv[0, cached:])
            vs.append(kv[1, cached:])
            qs.append(torch.randn(new, h_q, d, generator=gen).to(dtype))
        q_lens = torch.tensor([n for _, n in specs])
        self.q, self.k, self.v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
        self.meta = AttentionMetadata(
            slot_mapping=torch.cat(slots),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            context_lens=torch.tensor([c + n for c, n in specs], dtype=torch.int32),
            query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(torch.int32),
            max_query_len=int(q_lens.max()),
            max_context_len=max(c + n for c, n in specs),
            block_size=BS,
        )

    def reference(self, scale: float, window: int | None) -> torch.Tensor:
        """The torch path in float32 on the same (rounded) values, on an unpoisoned cache."""
        cache = self.clean.float().clone()
        return torch_paged_attention(self.q.float(), self.k.float(), self.v.float(), cache, self.meta, scale, window)


def check(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert not got.isnan().any()
    err = (got.float() - want).abs().max().item()
    if dtype == torch.float32:
        assert err <= TOL[dtype], err
    else:
        assert err / want.abs().max().item() <= TOL[dtype], err


def run(batch: PagedBatch, scale: float, window: int | None = None, num_splits: int | None = None) -> torch.Tensor:
    store_kv(batch.k, batch.v, batch.poisoned, batch.meta.slot_mapping)
    out = torch.full(batch.q.shape, float("nan"), dtype=batch.q.dtype)
    return paged_attention(batch.q, batch.poisoned, batch.meta, scale, window, out=out, num_splits=num_splits)


MIXED = [(0, 21), (17, 1), (32, 9), (5, 1), (0, 3)]  # prefills, decodes, prefix-cached prefill chunks
CASES = [
    # specs, h_q, h_kv, d, dtype
    pytest.param(MIXED, 2, 2, 64, torch.float32, id="mixed-gqa1-d64-fp32"),
    pytest.param(MIXED, 4, 1, 128, torch.float32, id="mixed-gqa4-d128-fp32"),
    pytest.param(MIXED, 8, 1, 64, torch.bfloat16, id="mixed-gqa8-d64-bf16"),
    pytest.param([(16, 20), (40, 7)], 8, 2, 128, torch.bfloat16, id="prefix-cached-gqa4-d128-bf16"),
    pytest.param([(0, 18), (3, 1)], 4, 4, 64, torch.float16, id="mixed-gqa1-d64-fp16"),
]


@pytest.mark.parametrize("specs,h_q,h_kv,d,dtype", CASES)
def test_unified_kernel_matches_torch(specs, h_q: int, h_kv: int, d: int, dtype: torch.dtype) -> None:
    batch = PagedBatch(specs, h_q, h_kv, d, dtype)
    scale = d**-0.5
    check(run(batch, scale), batch.reference(scale, None), dtype)


def test_sliding_window() -> None:
    batch = PagedBatch([(20, 15), (33, 1), (0, 12)], 4, 1, 64, torch.float32)
    check(run(batch, 0.125, window=9), batch.reference(0.125, 9), torch.float32)


DECODES = [(70, 1), (1, 1), (15, 1), (32, 1)]  # partially filled last blocks, one exactly full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h_q,h_kv,d", [(1, 1, 64), (4, 1, 128), (8, 1, 64)])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_paths_match_torch(splits: int, h_q: int, h_kv: int, d: int, dtype: torch.dtype) -> None:
    batch = PagedBatch(DECODES, h_q, h_kv, d, dtype)
    check(run(batch, d**-0.5, num_splits=splits), batch.reference(d**-0.5, None), dtype)


def test_split_decode_more_splits_than_blocks_and_window() -> None:
    batch = PagedBatch([(2, 1), (40, 1)], 4, 2, 64, torch.float32)
    check(run(batch, 0.125, num_splits=8), batch.reference(0.125, None), torch.float32)
    check(run(batch, 0.125, window=10, num_splits=4), batch.reference(0.125, 10), torch.float32)


def test_64bit_offsets_for_caches_past_2_31_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    """The int64 offset variant (taken when a tensor has 2**31 elements or more) computes the same."""
    import importlib

    import triton.language as tl

    for name in ("engine.kernels.paged_attention", "engine.kernels.split_decode"):  # the modules, not the functions
        monkeypatch.setattr(importlib.import_module(name), "offset_dtype", lambda *tensors: tl.int64)
    batch = PagedBatch(MIXED, 4, 2, 64, torch.float32)
    check(run(batch, 0.125), batch.reference(0.125, None), torch.float32)
    decodes = PagedBatch(DECODES, 4, 2, 64, torch.float32)
    for splits in (1, 3):
        check(run(decodes, 0.125, num_splits=splits), decodes.reference(0.125, None), torch.float32)


def test_offset_dtype_widens_only_past_2_31_elements() -> None:
    import triton.language as tl

    from engine.kernels.common import offset_dtype

    small = torch.empty(4)
    big = torch.empty(1).expand(2**31)  # one element behind it: only numel() is read
    assert offset_dtype(small) == tl.int32 and offset_dtype(small, big) == tl.int64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_slots_and_skips_negative(dtype: torch.dtype) -> None:
    h_kv, d, tokens = 2, 64, 7
    cache = torch.randn(2, 4, BS, h_kv, d).to(dtype)
    before = cache.clone()
    # k/v as strided views of one projection, like the models' split of a fused qkv output
    kv = torch.randn(tokens, 2, h_kv, d).to(dtype)
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.tensor([5, -1, 17, 63, -1, 0, 40])
    store_kv(k, v, cache, slots)
    flat = cache.view(2, -1, h_kv, d)
    keep = slots >= 0
    assert torch.equal(flat[0, slots[keep]], k[keep])
    assert torch.equal(flat[1, slots[keep]], v[keep])
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots[keep]] = False
    assert torch.equal(flat[:, untouched], before.view(2, -1, h_kv, d)[:, untouched])
