"""Tensor parallelism over ``torch.distributed`` (NCCL on GPUs, gloo on CPU) for the native models.

Megatron-style split of every decoder layer across ``world`` ranks: q/k/v and gate/up are
column-split (each rank holds ``heads / world`` query and KV heads and ``intermediate / world``
MLP rows), o_proj and down_proj are row-split and summed with one all-reduce each. So each rank's
KV cache holds only its KV heads: ``[2, blocks, block_size, kv_heads / world, head_dim]``.
Embeddings, norms and the LM head are replicated.

Rank 0 runs the whole engine (scheduler, block manager, sampler) around a ``TensorParallelModel``;
each forward broadcasts the step (token ids, positions, slot mapping, block tables, lengths) to
the other ranks, which run ``worker_loop`` and join the all-reduces. ``stop()`` ends the workers.
Every rank loads the full checkpoint and keeps its slice (simple, not memory-frugal at load).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from engine.attention_metadata import AttentionMetadata
from engine.layers import MergedLinear, PagedAttention

_STEP, _STOP = 1, 0
_HEADER = 8  # cmd, T, S, table width, max_query_len, max_context_len, block_size, num_blocks


class RowParallelLinear(nn.Module):
    """The input-dim slice of a linear layer; partial products are summed across ranks."""

    def __init__(self, linear: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        part = _even(linear.in_features, world, "input features")
        self.weight = nn.Parameter(linear.weight.data[:, rank * part:(rank + 1) * part].contiguous(),
                                   requires_grad=False)
        self.bias = linear.bias  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        dist.all_reduce(y)
        return y if self.bias is None else y + self.bias


def _even(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"tensor parallel size {world} does not divide the model's {n} {what}")
    return n // world


def _column_slice(layer: MergedLinear, parts: list[int], rank: int) -> MergedLinear:
    """A MergedLinear keeping rows [rank*part, (rank+1)*part) of each of its shards."""
    weights = layer.weight.data.split(layer.out_sizes, dim=0)
    biases = layer.bias.data.split(layer.out_sizes, dim=0) if layer.bias is not None else None
    out = MergedLinear(layer.in_features, parts, bias=layer.bias is not None).to(layer.weight.device,
                                                                                 layer.weight.dtype)
    out.weight.data = torch.cat([w[rank * p:(rank + 1) * p] for w, p in zip(weights, parts)]).contiguous()
    if biases is not None:
        out.bias.data = torch.cat([b[rank * p:(rank + 1) * p] for b, p in zip(biases, parts)]).contiguous()
    return out.requires_grad_(False)


def shard_model(model: nn.Module, rank: int, world: int) -> nn.Module:
    """Keep this rank's slice of every decoder layer of a native (Llama-family) model, in place."""
    for layer in model.model.layers:  # type: ignore[union-attr]
        attn, mlp = layer.self_attn, layer.mlp
        d = attn.head_dim
        hq = _even(attn.num_heads, world, "attention heads")
        hk = _even(attn.num_kv_heads, world, "KV heads")
        attn.qkv_proj = _column_slice(attn.qkv_proj, [hq * d, hk * d, hk * d], rank)
        attn.o_proj = RowParallelLinear(attn.o_proj, rank, world)
        attn.num_heads, attn.num_kv_heads = hq, hk
        old = attn.attn
        attn.attn = PagedAttention(hq, hk, d, old.scale, sliding_window=old.sliding_window, backend=old.backend)
        part = _even(mlp.gate_up_proj.out_sizes[0], world, "MLP intermediate size")
        mlp.gate_up_proj = _column_slice(mlp.gate_up_proj, [part, part], rank)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world)
    return model


@dataclass
class _Step:
    ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    num_blocks: int


def _broadcast_step(ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, num_blocks: int) -> None:
    s, w = meta.block_tables.shape
    header = torch.tensor([_STEP, ids.numel(), s, w, meta.max_query_len, meta.max_context_len, meta.block_size,
                           num_blocks], dtype=torch.long, device=ids.device)
    dist.broadcast(header, src=0)
    dist.broadcast(torch.cat([ids, positions, meta.slot_mapping.long()]), src=0)
    dist.broadcast(torch.cat([meta.block_tables.flatten(), meta.context_lens, meta.query_start_loc]).int(), src=0)


def _receive_step(device: torch.device) -> _Step | None:
    header = torch.empty(_HEADER, dtype=torch.long, device=device)
    dist.broadcast(header, src=0)
    cmd, t, s, w, max_q, max_ctx, block_size, num_blocks = header.tolist()
    if cmd == _STOP:
        return None
    longs = torch.empty(3 * t, dtype=torch.long, device=device)
    dist.broadcast(longs, src=0)
    ints = torch.empty(s * w + s + s + 1, dtype=torch.int32, device=device)
    dist.broadcast(ints, src=0)
    ids, positions, slots = longs.split(t)
    tables, lens, starts = ints.split([s * w, s, s + 1])
    meta = AttentionMetadata(slot_mapping=slots, block_tables=tables.view(s, w), context_lens=lens,
                             query_start_loc=starts, max_query_len=max_q, max_context_len=max_ctx,
                             block_size=block_size)
    return _Step(ids, positions, meta, num_blocks)


class TensorParallelModel(nn.Module):
    """Rank 0's model: broadcasts each step, runs its slice; ``kv_shape`` is the per-rank cache."""

    def __init__(self, model: nn.Module, world: int) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        first = model.model.layers[0].self_attn  # type: ignore[union-attr, index]
        self.kv_shape = (len(model.model.layers), first.num_kv_heads, first.head_dim)  # type: ignore[union-attr, arg-type]
        self.world = world
        self._stopped = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        _broadcast_step(input_ids, positions, meta, kv_caches[0].shape[1])
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)  # type: ignore[operator]

    def stop(self) -> None:
        """Tell the workers to leave their loop."""
        if not self._stopped:
            self._stopped = True
            device = next(self.model.parameters()).device
            dist.broadcast(torch.zeros(_HEADER, dtype=torch.long, device=device), src=0)


@torch.inference_mode()
def worker_loop(model: nn.Module, kv_dtype: torch.dtype) -> None:
    """A rank > 0: run every broadcast step through this rank's slice until told to stop."""
    device = next(model.parameters()).device
    first = model.model.layers[0].self_attn  # type: ignore[union-attr, index]
    layers = len(model.model.layers)  # type: ignore[union-attr, arg-type]
    caches: list[torch.Tensor] = []
    while (step := _receive_step(device)) is not None:
        if not caches or caches[0].shape[1] != step.num_blocks:
            shape = (2, step.num_blocks, step.meta.block_size, first.num_kv_heads, first.head_dim)
            caches = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(layers)]
        model(step.ids, step.positions, caches, step.meta)


def _device_of(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


def _init(rank: int, world: int, init_method: str, device: str) -> None:
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)


def _worker_main(rank: int, world: int, init_method: str, config: Any) -> None:
    from engine.loader import load_model

    _init(rank, world, init_method, config.device)
    try:
        model, _ = load_model(config.model, config.torch_dtype, _device_of(config.device, rank), config.attn_backend)
        worker_loop(shard_model(model, rank, world), config.torch_dtype)
    finally:
        dist.destroy_process_group()
    # Done: leave without the interpreter's teardown, in which a native thread torch left joinable
    # (gloo's) now and then aborts the process (SIGABRT, "terminate called without an active
    # exception") after its work is over; its exit code would then say it failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclass
class TensorParallelGroup:
    """Rank 0's engine and the worker processes behind it."""

    engine: Any  # LLMEngine
    model: TensorParallelModel
    workers: list[Any]

    def shutdown(self) -> None:
        self.model.stop()
        for w in self.workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_tensor_parallel(config: Any, world: int) -> TensorParallelGroup:
    """Start ranks 1..world-1 as processes, join as rank 0, and build the engine around the slices."""
    from engine.llm_engine import LLMEngine
    from engine.loader import load_model

    if world < 2:
        raise ValueError("tensor parallelism needs a size of at least 2")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=_worker_main, args=(r, world, init_method, replace(config)), daemon=True)
               for r in range(1, world)]
    for w in workers:
        w.start()
    _init(0, world, init_method, config.device)
    model, hf_config = load_model(config.model, config.torch_dtype, _device_of(config.device, 0), config.attn_backend)
    tp = TensorParallelModel(shard_model(model, 0, world), world)
    try:
        engine = LLMEngine(config, model=tp, hf_config=hf_config)
    except BaseException:
        tp.stop()
        raise
    return TensorParallelGroup(engine, tp, workers)
