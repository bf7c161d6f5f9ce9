"""RMSNorm as Llama/Qwen compute it (in float32, weight applied in the model dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``forward(x)`` normalises; ``forward(x, residual)`` first adds the residual and returns
    ``(normed, new_residual)`` so decoder layers can carry the residual stream without extra copies."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """``weight * (x * rsqrt(mean(x^2) + eps))`` in float32, as transformers computes it; the
        fused ``rms_norm`` gives the same bits in one op instead of six."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # the same bits, one op
        h = F.rms_norm(x.to(torch.float32), self.weight.shape, None, self.eps)
        return self.weight * h.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
