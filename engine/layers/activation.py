"""The gated SiLU MLP of Llama-family models, with gate and up projections fused in one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import MergedLinear


class SiluAndMul(nn.Module):
    """``x = [gate, up]`` on the last dim -> ``silu(gate) * up``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, act: str = "silu") -> None:
        super().__init__()
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}: only 'silu' is implemented")
        self.gate_up_proj = MergedLinear(hidden_size, [intermediate_size, intermediate_size], bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))
