"""Linear layers whose weight is several checkpoint tensors stacked on the output dim
(q/k/v, gate/up), so one matmul does the work of several."""

from __future__ import annotations

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """A linear layer over ``sum(out_sizes)`` outputs; shard ``i`` is loaded with ``load_shard``."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        super().__init__(in_features, sum(out_sizes), bias=bias)
        self.out_sizes = list(out_sizes)
        self.offsets = [sum(out_sizes[:i]) for i in range(len(out_sizes))]

    def load_shard(self, shard: int, tensor: torch.Tensor, *, is_bias: bool = False) -> None:
        """Copy one checkpoint tensor (weight ``[out_i, in]`` or bias ``[out_i]``) into its rows."""
        target = self.bias if is_bias else self.weight
        if target is None:
            raise ValueError("checkpoint has a bias for a layer built without one")
        start, size = self.offsets[shard], self.out_sizes[shard]
        rows = target.data[start : start + size]
        if rows.shape != tensor.shape:
            raise ValueError(f"shard {shard}: expected shape {tuple(rows.shape)}, got {tuple(tensor.shape)}")
        rows.copy_(tensor)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Split an output ``[..., sum(out_sizes)]`` back into its shards."""
        return y.split(self.out_sizes, dim=-1)
