"""Seeded random HF checkpoints (built with transformers itself) for the engine tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=384,
    max_position_embeddings=512,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    tie_word_embeddings=False,
)

ARCHS: dict[str, Callable[[], transformers.PretrainedConfig]] = {
    "llama": lambda: transformers.LlamaConfig(
        **SIZES,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": lambda: transformers.MistralConfig(**SIZES, sliding_window=None),
    "qwen2": lambda: transformers.Qwen2Config(**SIZES),
    "qwen3": lambda: transformers.Qwen3Config(**{**SIZES, "tie_word_embeddings": True}, head_dim=32),
}


def build_checkpoint(arch: str, path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(ARCHS[arch](), dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoint(arch)`` -> a folder with config.json + model.safetensors (cached per arch)."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = build_checkpoint(arch, tmp_path_factory.mktemp(f"ckpt-{arch}"))
        return made[arch]

    return get
