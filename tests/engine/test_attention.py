"""Paged attention (the torch path, and the "cpu" backend's C++ decode kernel) against a dense
causal reference."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.attention_metadata import AttentionMetadata
from engine.config import EngineConfig, resolve_attn_backend
from engine.layers.attention import PagedAttention

BS = 4
BACKENDS = ["torch", "cpu"]  # small blocks so that sequences span several, with partially filled last blocks


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_len: int, scale: float,
                    window: int | None = None) -> torch.Tensor:
    """q [q_len, Hq, D] are the last q_len positions of a context whose K/V are k, v [L, Hkv, D]."""
    L, h_kv, _ = k.shape
    g = q.shape[1] // h_kv
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk.double()) * scale
    qpos = torch.arange(L - q_len, L)[:, None]
    kpos = torch.arange(L)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv.double()).to(q.dtype)


class Batch:
    """Sequences with a cached prefix (already in the cache) and new tokens, in shuffled blocks."""

    def __init__(self, specs: list[tuple[int, int]], h_q: int, h_kv: int, d: int, num_blocks: int = 64,
                 seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.cache = torch.zeros(2, num_blocks, BS, h_kv, d)
        free = torch.randperm(num_blocks, generator=gen).tolist()
        max_blocks = max(-(-(c + n) // BS) for c, n in specs)
        tables, slots, qs, ks, vs, self.full = [], [], [], [], [], []
        for cached, new in specs:
            total = cached + new
            blocks = [free.pop() for _ in range(-(-total // BS))]
            tables.append(blocks + [-1] * (max_blocks - len(blocks)))
            k = torch.randn(total, h_kv, d, generator=gen)
            v = torch.randn(total, h_kv, d, generator=gen)
            pos_slots = torch.tensor([blocks[p // BS] * BS + p % BS for p in range(total)])
            self.cache[0].view(-1, h_kv, d)[pos_slots[:cached]] = k[:cached]
            self.cache[1].view(-1, h_kv, d)[pos_slots[:cached]] = v[:cached]
            slots.append(pos_slots[cached:])
            qs.append(torch.randn(new, h_q, d, generator=gen))
            ks.append(k[cached:])
            vs.append(v[cached:])
            self.full.append((k, v))
        q_lens = torch.tensor([n for _, n in specs])
        self.q, self.k, self.v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
        self.specs = specs
        self.meta = AttentionMetadata(
            slot_mapping=torch.cat(slots).long(),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            context_lens=torch.tensor([c + n for c, n in specs], dtype=torch.int32),
            query_start_loc=torch.cat([torch.zeros(1), q_lens.cumsum(0)]).to(torch.int32),
            max_query_len=int(q_lens.max()),
            max_context_len=max(c + n for c, n in specs),
            block_size=BS,
        )

    def reference(self, scale: float, window: int | None = None) -> torch.Tensor:
        outs, start = [], 0
        for (_, new), (k, v) in zip(self.specs, self.full):
            outs.append(dense_reference(self.q[start : start + new], k, v, new, scale, window))
            start += new
        return torch.cat(outs)


@pytest.mark.parametrize(
    "specs",
    [
        [(0, 7)],  # one prefill, partial last block
        [(0, 5), (0, 12), (0, 1), (0, 9)],  # several prefills of different lengths
        [(6, 1), (13, 1), (3, 1)],  # decodes only
        [(8, 5), (3, 9)],  # prefill chunks attending to cached blocks
        [(10, 1), (0, 6), (4, 1), (5, 7)],  # mixed decodes and chunks
    ],
)
@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (8, 2)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_dense_reference(specs: list[tuple[int, int]], h_q: int, h_kv: int, backend: str) -> None:
    d = 16
    batch = Batch(specs, h_q, h_kv, d)
    attn = PagedAttention(h_q, h_kv, d, d**-0.5, backend=backend)
    out = attn(batch.q, batch.k, batch.v, batch.cache, batch.meta)
    torch.testing.assert_close(out, batch.reference(d**-0.5), atol=1e-5, rtol=1e-5)


def test_writes_new_tokens_into_their_slots() -> None:
    batch = Batch([(3, 6), (0, 2)], 2, 2, 8)
    PagedAttention(2, 2, 8, 0.3)(batch.q, batch.k, batch.v, batch.cache, batch.meta)
    k_flat = batch.cache[0].view(-1, 2, 8)
    v_flat = batch.cache[1].view(-1, 2, 8)
    torch.testing.assert_close(k_flat[batch.meta.slot_mapping], batch.k)
    torch.testing.assert_close(v_flat[batch.meta.slot_mapping], batch.v)


def test_negative_slots_are_not_written() -> None:
    batch = Batch([(0, 4)], 2, 2, 8)
    batch.meta.slot_mapping[-1] = -1
    before = batch.cache.clone()
    PagedAttention(2, 2, 8, 0.3)(batch.q, batch.k, batch.v, batch.cache, batch.meta)
    changed = (batch.cache != before).any(dim=(0, 3, 4)).flatten().nonzero().squeeze(1)
    assert sorted(changed.tolist()) == sorted(batch.meta.slot_mapping[:-1].tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window(backend: str) -> None:
    d = 8
    batch = Batch([(9, 3), (0, 11), (12, 1), (2, 1)], 4, 2, d)
    out = PagedAttention(4, 2, d, d**-0.5, sliding_window=5, backend=backend)(
        batch.q, batch.k, batch.v, batch.cache, batch.meta
    )
    torch.testing.assert_close(out, batch.reference(d**-0.5, window=5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_after_prefill_through_the_cache(backend: str) -> None:
    """A prefill step then a decode step that reads the prefill's K/V back from the cache."""
    d, h = 8, 2
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(10, h, d, generator=gen) for _ in range(3))
    cache = torch.zeros(2, 8, BS, h, d)
    table = torch.tensor([[5, 2, 7]], dtype=torch.int32)
    slots = torch.tensor([table[0, p // BS].item() * BS + p % BS for p in range(10)])
    attn = PagedAttention(h, h, d, d**-0.5, backend=backend)

    def meta(start: int, n: int) -> AttentionMetadata:
        return AttentionMetadata(
            slots[start : start + n],
            table,
            torch.tensor([start + n], dtype=torch.int32),
            torch.tensor([0, n], dtype=torch.int32),
            n,
            start + n,
            BS,
        )

    attn(q[:9], k[:9], v[:9], cache, meta(0, 9))
    out = attn(q[9:], k[9:], v[9:], cache, meta(9, 1))
    torch.testing.assert_close(out, dense_reference(q[9:], k, v, 1, d**-0.5), atol=1e-5, rtol=1e-5)


def test_rejects_unknown_backend_and_bad_gqa() -> None:
    with pytest.raises(ValueError, match="unknown attention backend"):
        PagedAttention(4, 2, 8, 1.0, backend="nope")
    with pytest.raises(ValueError, match="multiple"):
        PagedAttention(6, 4, 8, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_decode_kernel_matches_the_torch_path_in_each_dtype(dtype: torch.dtype) -> None:
    """Decodes only (the kernel's whole batch), long contexts over many blocks, GQA 4:1, head size
    not a multiple of the vector width."""
    d = 40
    batch = Batch([(c, 1) for c in (0, 3, 37, 90, 150, 16, 63)], 8, 2, d, num_blocks=128, seed=3)
    cache, q, k, v = (t.to(dtype) for t in (batch.cache, batch.q, batch.k, batch.v))
    ref = PagedAttention(8, 2, d, d**-0.5, backend="torch")(q, k, v, cache.clone(), batch.meta)
    out = PagedAttention(8, 2, d, d**-0.5, backend="cpu")(q, k, v, cache, batch.meta)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), batch.reference(d**-0.5).float(), atol=tol * 4, rtol=tol * 4)


def test_cpu_kernel_rejects_bad_inputs() -> None:
    batch = Batch([(5, 1)], 4, 2, 8)
    with pytest.raises(RuntimeError, match="same dtype"):
        cpu_kernels.paged_decode(
            batch.q.double(), batch.cache, batch.meta.block_tables, batch.meta.context_lens, 1.0, None
        )
    with pytest.raises(RuntimeError, match="multiple of the KV heads"):
        cpu_kernels.paged_decode(
            batch.q[:, :3], batch.cache, batch.meta.block_tables, batch.meta.context_lens, 1.0, None
        )


def test_auto_backend_is_the_cpu_kernel_on_cpu() -> None:
    assert cpu_kernels.available(), cpu_kernels.build_error()
    assert EngineConfig(model="unused").attn_backend == "cpu"
    assert EngineConfig(model="unused", attn_backend="torch").attn_backend == "torch"
    assert resolve_attn_backend("auto", "cuda") == "triton"  # what CUDA graphs need
    with pytest.raises(ValueError, match="runs on the CPU"):
        resolve_attn_backend("cpu", "cuda")
    with pytest.raises(ValueError, match="attn_backend must be one of"):
        EngineConfig(model="unused", attn_backend="flash")


def test_cpu_kernels_build_error_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No compiler: ``available()`` is False with the reason, auto falls back to torch, and an
    explicit "cpu" backend is refused with that reason."""
    monkeypatch.setattr(cpu_kernels, "_state", {})
    monkeypatch.setenv("SWITCHYARD_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert not cpu_kernels.available()
    assert "no-such-compiler" in (cpu_kernels.build_error() or "")
    assert resolve_attn_backend("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match="unavailable"):
        resolve_attn_backend("cpu", "cpu")
