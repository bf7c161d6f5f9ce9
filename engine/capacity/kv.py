"""KV-cache arithmetic: bytes per token, blocks from a byte budget, what fits."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """K and V, every layer."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * block_size

    def blocks_in(self, num_bytes: int, block_size: int) -> int:
        return max(0, num_bytes // self.bytes_per_block(block_size))


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(frozen=True)
class Capacity:
    """What a cache of ``num_blocks`` blocks holds."""

    layout: KVLayout
    num_blocks: int
    block_size: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def bytes(self) -> int:
        return self.num_blocks * self.layout.bytes_per_block(self.block_size)

    def concurrent_sequences(self, avg_len: int) -> int:
        """How many sequences of ``avg_len`` tokens fit at once (whole blocks each)."""
        return self.num_blocks // max(1, blocks_for(avg_len, self.block_size))

    def check_fits(self, max_model_len: int) -> None:
        """Raise a startup error, saying what to change, when one max-length sequence does not fit."""
        need = blocks_for(max_model_len, self.block_size)
        if need <= self.num_blocks:
            return
        need_bytes = need * self.layout.bytes_per_block(self.block_size)
        raise ValueError(
            f"the KV cache has {self.num_blocks} blocks ({self.tokens} tokens, "
            f"{self.bytes / 2**20:.1f} MiB) but one sequence of max_model_len={max_model_len} "
            f"needs {need} blocks ({need_bytes / 2**20:.1f} MiB); lower max_model_len (at most "
            f"{self.tokens}) or give the cache more memory (gpu_memory_utilization on GPU, "
            f"kv_cache_bytes / num_kv_blocks on CPU)"
        )

    def describe(self) -> str:
        return (
            f"{self.num_blocks} KV blocks x {self.block_size} tokens = {self.tokens} tokens "
            f"({self.bytes / 2**20:.1f} MiB, {self.layout.bytes_per_token} B/token)"
        )
