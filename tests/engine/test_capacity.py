"""KV-cache arithmetic."""

from __future__ import annotations

import pytest
import torch

from engine.capacity.kv import Capacity, KVLayout, blocks_for


def test_bytes_blocks_and_concurrency() -> None:
    layout = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    assert layout.bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB, Llama-3-8B
    assert layout.blocks_in(1 << 30, 16) == (1 << 30) // (16 * layout.bytes_per_token)
    cap = Capacity(layout, num_blocks=512, block_size=16)
    assert cap.tokens == 8192
    assert cap.concurrent_sequences(1000) == 512 // blocks_for(1000, 16)
    cap.check_fits(8192)
    with pytest.raises(ValueError, match="lower max_model_len"):
        cap.check_fits(8193)
