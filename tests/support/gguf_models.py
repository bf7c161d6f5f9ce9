"""GGUF files written from the seeded tiny Hugging Face folders of ``tests/support/fallback_models``, as
llama.cpp's converter lays them out (tensor names from the gguf package's name map, GPT-2's Conv1D
weights transposed, Bloom's fused QKV regrouped), with the folder's tokenizer (vocabulary, merges,
special tokens, chat template) in the metadata: architectures the engine does not implement
natively, to test the fallback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import transformers
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, TokenType, get_tensor_name_map
from safetensors.numpy import load_file

from tests.support.fallback_models import build_model

_TRANSPOSED = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")  # GPT-2's Conv1D


def add_hparams(writer: GGUFWriter, config: Any) -> None:
    """A decoder's shape as GGUF metadata, from its Hugging Face ``config`` (the converter's keys)."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))


def add_tokenizer(writer: GGUFWriter, folder: Path) -> None:
    """The folder's byte-level BPE tokenizer and chat template as GGUF metadata (llama.cpp's "gpt2")."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = spec["model"]["vocab"] | {t["content"]: t["id"] for t in spec["added_tokens"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(pair) for pair in spec["model"]["merges"]])
    writer.add_bos_token_id(vocab[config["bos_token"]])
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_chat_template(config["chat_template"])


def _bloom_qkv(array: np.ndarray, heads: int) -> np.ndarray:
    """HF Bloom's fused QKV rows are per head (q, k, v); llama.cpp's converter groups them q | k | v."""
    grouped = array.reshape(heads, 3, -1, *array.shape[1:]).swapaxes(0, 1)
    return grouped.reshape(array.shape)


# arch -> (gguf architecture, config fields transformers' GGUF reader leaves at their defaults)
_ARCHS = {
    # GPT-2: feed_forward_length and context_length are not mapped (n_inner 4 x n_embd, n_positions 1024)
    "gpt2": (MODEL_ARCH.GPT2, {"n_inner": None, "n_positions": 1024}),
    "bloom": (MODEL_ARCH.BLOOM, {}),
}


def write_gguf(arch: str, out: Path, seed: int = 0, edit: Callable[[GGUFWriter], None] | None = None) -> Path:
    """A tiny random ``arch`` model (F32) as ``out`` (a .gguf path); its HF folder is built beside it;
    ``edit`` adds metadata."""
    gguf_arch, overrides = _ARCHS[arch]
    folder = build_model(arch, out.with_suffix(""), seed=seed, **overrides)
    config = transformers.AutoConfig.from_pretrained(folder)
    layers, hidden, heads = config.num_hidden_layers, config.hidden_size, config.num_attention_heads
    weights = load_file(str(folder / "model.safetensors"))
    names = get_tensor_name_map(gguf_arch, layers)
    writer = GGUFWriter(str(out), MODEL_ARCH_NAMES[gguf_arch])
    writer.add_block_count(layers)
    writer.add_context_length(getattr(config, "n_positions", 2048))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(4 * hidden)
    writer.add_head_count(heads)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_vocab_size(config.vocab_size)
    add_tokenizer(writer, folder)
    if edit is not None:
        edit(writer)
    for hf_name, array in weights.items():
        if hf_name == "lm_head.weight":
            continue  # tied to the embeddings (no output.weight: the reader ties them back)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias")) or \
            names.get_name(hf_name.removeprefix("transformer."), try_suffixes=(".weight", ".bias"))  # Bloom's map
        assert name is not None, hf_name
        if arch == "gpt2" and name.endswith(_TRANSPOSED):
            array = array.T
        elif arch == "bloom" and name.endswith(("attn_qkv.weight", "attn_qkv.bias")):
            array = _bloom_qkv(array, heads)
        writer.add_tensor(name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
