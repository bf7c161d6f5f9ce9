"""Seeded random tiny HF checkpoints of architectures the engine has no native implementation of.

Each folder is a real Hugging Face model folder (config.json, model.safetensors, and the tokenizer
of the built-in tiny model with its chat template), built by transformers itself, so both fallback
paths and the ``transformers`` oracle load the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from engine.tiny_model import BOS, EOS, EOT, write_tokenizer

MAX_LEN = 256

# Attention/hidden sizes small enough for CPU tests; vocab comes from the tokenizer.
ARCHS: dict[str, Callable[[int], transformers.PretrainedConfig]] = {
    "gpt2": lambda vocab: transformers.GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=MAX_LEN, n_inner=128,
    ),
    "gpt_neox": lambda vocab: transformers.GPTNeoXConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=MAX_LEN, rotary_pct=0.5, tie_word_embeddings=False,
    ),
    "phi3": lambda vocab: transformers.Phi3Config(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=MAX_LEN,
    ),
    "gemma": lambda vocab: transformers.GemmaConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, intermediate_size=128, max_position_embeddings=MAX_LEN,
    ),
    # Bloom's attention does not go through transformers' attention interface: plain path only.
    "bloom": lambda vocab: transformers.BloomConfig(vocab_size=vocab, hidden_size=64, n_layer=2, n_head=4),
}


def build_model(arch: str, path: Path, seed: int = 0, **overrides: object) -> Path:
    """Save a seeded random ``arch`` model plus the tiny tokenizer as an HF folder at ``path``
    (``overrides``: config fields to change)."""
    path.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(path, MAX_LEN)  # the built-in tiny model's tokenizer (engine.tiny_model)
    eos_ids = [tok.token_to_id(EOT), tok.token_to_id(EOS)]
    config = ARCHS[arch](tok.get_vocab_size())
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.token_to_id(BOS), eos_ids, None
    config.architectures = [transformers.AutoModelForCausalLM._model_mapping[type(config)].__name__]
    config.initializer_range = 0.25  # the default 0.02 makes tiny random models repeat one token
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = eos_ids
    model.save_pretrained(path, safe_serialization=True)
    return path
