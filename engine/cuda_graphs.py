"""CUDA graphs for decode steps.

A decode step of a small model is dominated by kernel-launch overhead; replaying a captured graph
launches the whole forward at once. Graphs are captured at startup for a ladder of batch sizes
(largest first, sharing one memory pool); a step with ``n`` decodes is padded up to the nearest
captured size. The padded rows write nowhere (slot -1) and attend to nothing (context length 0).

Graphs need a forward without host syncs or data-dependent shapes: the Triton attention backend
qualifies (its launch depends only on the batch size), the torch reference path does not, so
``ModelRunner`` uses graphs only with ``attn_backend="triton"`` on CUDA and without
``enforce_eager``.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention_metadata import AttentionMetadata

BATCH_LADDER: tuple[int, ...] = (1, 2, 4, 8, *range(16, 257, 16), *range(288, 513, 32))


def ladder_for(max_num_seqs: int, ladder: tuple[int, ...] = BATCH_LADDER) -> list[int]:
    """The sizes to capture: the ladder up to ``max_num_seqs``, with ``max_num_seqs`` itself on top."""
    sizes = sorted({b for b in ladder if b < max_num_seqs} | {max_num_seqs})
    return sizes


class DecodeGraphs:
    """Captured decode forwards; ``run`` replays the smallest one that holds the batch."""

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor], max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device, ladder: tuple[int, ...] = BATCH_LADDER) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_context_len = max_model_len
        self.sizes = ladder_for(max_num_seqs, ladder)
        top = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(top, self.max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(top, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(top + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            context_lens=self.context_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            max_query_len=1,
            max_context_len=self.max_context_len,
            block_size=self.block_size,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up (compiles the kernels) and capture every size, largest first, in one pool."""
        pool = None
        for size in reversed(self.sizes):
            meta = self._meta(size)
            args = (self.input_ids[:size], self.positions[:size], self.kv_caches, meta)
            self.model(*args)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.model(*args)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def can_run(self, num_tokens: int, meta: AttentionMetadata) -> bool:
        """A decode-only step (one token per sequence) that a captured size holds."""
        return (meta.max_query_len == 1 and num_tokens == meta.context_lens.shape[0]
                and num_tokens <= self.sizes[-1] and meta.block_tables.shape[1] <= self.max_blocks)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Copy the step into the static buffers, replay, and return the hidden states ``[n, H]``.

        The result is a view of the graph's output buffer: use it before the next ``run``.
        """
        n = input_ids.shape[0]
        size = next(s for s in self.sizes if s >= n)
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        self.context_lens[:n].copy_(meta.context_lens)
        if size > n:
            self.positions[n:size].zero_()
            self.slot_mapping[n:size].fill_(-1)
            self.context_lens[n:size].zero_()
        self.graphs[size].replay()
        return self.outputs[size][:n]
