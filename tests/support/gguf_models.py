"""GGUF files written from the seeded tiny Hugging Face folders of ``tests/support/fallback_models``, as
llama.cpp's converter lays them out (tensor names from the gguf package's name map, GPT-2's Conv1D
weights transposed), with the folder's tokenizer (vocabulary, merges, special tokens, chat template)
in the metadata. Architectures the engine does not implement natively, to test the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import transformers
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, TokenType, get_tensor_name_map
from safetensors.numpy import load_file

from tests.support.fallback_models import build_model

_TRANSPOSED = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")  # GPT-2's Conv1D


def _add_tokenizer(writer: GGUFWriter, folder: Path) -> None:
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


def write_gpt2_gguf(out: Path, seed: int = 0) -> Path:
    """A tiny random GPT-2 (F32) as ``out`` (a .gguf path); its HF folder is built beside it."""
    # transformers maps neither feed_forward_length nor context_length of a GPT-2 GGUF onto its config
    # (n_inner and n_positions keep their defaults, 4 x n_embd and 1024): build the model with those
    folder = build_model("gpt2", out.with_suffix(""), seed=seed, n_inner=None, n_positions=1024)
    config = transformers.AutoConfig.from_pretrained(folder)
    weights = load_file(str(folder / "model.safetensors"))
    names = get_tensor_name_map(MODEL_ARCH.GPT2, config.n_layer)
    writer = GGUFWriter(str(out), MODEL_ARCH_NAMES[MODEL_ARCH.GPT2])
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    _add_tokenizer(writer, folder)
    for hf_name, array in weights.items():
        if hf_name == "lm_head.weight":
            continue  # tied to the embeddings (no output.weight: the reader ties them back)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        writer.add_tensor(name, np.ascontiguousarray(array.T if name.endswith(_TRANSPOSED) else array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
