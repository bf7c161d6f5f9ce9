"""What one step's attention needs to know about the flat batch, built once per step by the model
runner and read by every layer and by the kernels (below both, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [T] flat cache slot of each new token; <0 = do not write
    block_tables: torch.Tensor  # int32 [S, max_blocks] block ids per sequence, padded with -1 (or 0)
    context_lens: torch.Tensor  # int32 [S] tokens in the cache per sequence AFTER this step's writes
    query_start_loc: torch.Tensor  # int32 [S+1] cumulative new-token counts (cu_seqlens)
    max_query_len: int
    max_context_len: int
    block_size: int
    # Per-step derived index maps, filled lazily by the attention backend and shared by all layers.
    plans: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
