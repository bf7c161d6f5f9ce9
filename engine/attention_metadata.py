"""What one step's attention needs to know about the flat batch, built once per step by the model
runner and read by every layer and by the kernels (below both, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [T] flat cache slot of each new token; <0 = do not write
    block_tables: torch.Tensor  # int32 [S, W] block ids per sequence; entries past its blocks are never read
    context_lens: torch.Tensor  # int32 [S] tokens in the cache per sequence AFTER this step's writes
    query_start_loc: torch.Tensor  # int32 [S+1] cumulative new-token counts (cu_seqlens)
    max_query_len: int
    max_context_len: int
    block_size: int
    # What the model runner knows on the host, so the torch/cpu backends need no device->host sync
    # (None / False where unknown, as in the tensor-parallel workers).
    query_lens_host: list[int] | None = None
    context_lens_host: list[int] | None = None
    all_slots_valid: bool = False  # no negative slot in slot_mapping
    # Per-step derived index maps, filled lazily by the attention backend and shared by all layers.
    plans: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
