"""Seeded random tiny HF checkpoints of architectures the engine has no native implementation of.

Each folder is a real Hugging Face model folder (config.json, model.safetensors, tokenizer files
with a chat template), built by transformers itself, so both the fallback paths and the
``transformers`` oracle load the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|pad|>", "<|eos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
_TEXT = (
    "The quick brown fox jumps over the lazy dog. Switchyard routes requests to many providers. "
    "Paged attention keeps key and value blocks in a cache; continuous batching fills every step. "
    "Hello world, hello there! Numbers 0123456789 and punctuation: ;,.!?()[]{}'\" - + = / * ."
)

# Attention/hidden sizes small enough for CPU tests; vocab comes from the tokenizer.
ARCHS: dict[str, Callable[[int], transformers.PretrainedConfig]] = {
    "gpt2": lambda vocab: transformers.GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=256, n_inner=128,
        bos_token_id=1, eos_token_id=1, pad_token_id=0,
    ),
    "gpt_neox": lambda vocab: transformers.GPTNeoXConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=256, rotary_pct=0.5, bos_token_id=1, eos_token_id=1, pad_token_id=0,
        tie_word_embeddings=False,
    ),
    "phi3": lambda vocab: transformers.Phi3Config(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256, bos_token_id=1, eos_token_id=1, pad_token_id=0,
    ),
    "gemma": lambda vocab: transformers.GemmaConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, intermediate_size=128, max_position_embeddings=256, bos_token_id=1, eos_token_id=1,
        pad_token_id=0,
    ),
    # Bloom's attention does not go through transformers' attention interface: plain path only.
    "bloom": lambda vocab: transformers.BloomConfig(
        vocab_size=vocab, hidden_size=64, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=1, pad_token_id=0,
    ),
}


def build_tokenizer(path: Path) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few sentences, with special tokens and a chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([_TEXT] * 4, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>", bos_token="<|eos|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def build_model(arch: str, path: Path, seed: int = 0) -> Path:
    """Save a seeded random ``arch`` model plus the tiny tokenizer as an HF folder at ``path``."""
    tokenizer = build_tokenizer(path)
    config = ARCHS[arch](len(tokenizer))
    config.architectures = [transformers.AutoModelForCausalLM._model_mapping[type(config)].__name__]
    config.initializer_range = 0.25  # the default 0.02 makes tiny random models repeat one token
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path, safe_serialization=True)
    return path
