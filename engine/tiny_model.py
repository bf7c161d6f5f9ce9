"""The built-in tiny model: a shipped byte-level BPE tokenizer plus seeded random weights, saved as
a real Hugging Face folder that both our loader and transformers can load.

The tokenizer (``assets/tiny_tokenizer.json``) was trained with ``tokenizers`` on
``assets/corpus.txt``; ``python -m engine.tiny_model --retrain-tokenizer`` regenerates it.
``python -m engine.tiny_model PATH [--arch llama]`` writes a model folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ASSETS = Path(__file__).parent / "assets"
CORPUS = ASSETS / "corpus.txt"
TOKENIZER_JSON = ASSETS / "tiny_tokenizer.json"

BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT]

# Llama-3 style: BOS, then per message a role header, the trimmed content and <|eot_id|>.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = namespace(text='') %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'text' %}"
    "{%- set content.text = content.text + part['text'] %}{%- endif %}{%- endfor %}"
    "{%- set content = content.text %}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + content | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}},
    "mistral": {"sliding_window": None},
    "qwen2": {"tie_word_embeddings": True},
    "qwen3": {"head_dim": 32},
}

BASE_SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
}


def train_tokenizer(corpus: Path = CORPUS, vocab_size: int = 1024) -> Tokenizer:
    """Train the byte-level BPE on the shipped corpus (offline, deterministic for a given corpus)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(corpus)], trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]),
    ])
    return tok


def write_tokenizer(path: Path, model_max_length: int) -> Tokenizer:
    """Copy the shipped tokenizer into ``path`` with its config (chat template, special tokens)."""
    shutil.copyfile(TOKENIZER_JSON, path / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOT}, indent=2))
    return Tokenizer.from_file(str(TOKENIZER_JSON))


def make_config(arch: str, vocab_size: int, bos_id: int, eos_ids: list[int], **sizes: Any) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    if arch not in classes:
        raise ValueError(f"unknown tiny arch {arch!r}; choose from {sorted(classes)}")
    fields = {**BASE_SIZES, **ARCH_DEFAULTS[arch], **sizes}
    return classes[arch](vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_ids, **fields)


def build_tiny_model(path: str | Path, arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32,
                     max_shard_size: str | None = None, **sizes: Any) -> Path:
    """Write a seeded random model of ``arch`` (llama, mistral, qwen2, qwen3) as a HF folder.

    ``sizes`` override config fields (hidden_size, num_hidden_layers, rope_scaling, ...);
    ``max_shard_size`` (e.g. "50KB") writes a sharded checkpoint with an index.
    """
    from transformers import AutoModelForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    max_len = int(sizes.get("max_position_embeddings", BASE_SIZES["max_position_embeddings"]))
    tok = write_tokenizer(out, max_len)
    ids = {name: tok.token_to_id(name) for name in (BOS, EOT, EOS)}
    if None in ids.values():
        raise ValueError(f"the tiny tokenizer lacks a special token: {ids}")
    eos_ids = [int(ids[EOT] or 0), int(ids[EOS] or 0)]
    config = make_config(arch, tok.get_vocab_size(), int(ids[BOS] or 0), eos_ids, **sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(dtype)
    kwargs: dict[str, Any] = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out), **kwargs)
    return out


def ensure_tiny_model(path: str | Path, **kwargs: Any) -> Path:
    """Build the tiny model at ``path`` unless a complete folder is already there.

    The folder is written under a temporary name and renamed into place, so several processes
    starting at once (gateway workers) never see, or load, a half-written model.
    """
    out = Path(path)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file() and any(out.glob("*.safetensors")):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        build_tiny_model(staging, **kwargs)
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        try:
            os.rename(staging, out)
        except OSError:
            if not (out / "config.json").is_file():  # not another process's finished model
                raise FileExistsError(f"{out} exists but is not a complete model folder; remove it") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", nargs="?", help="folder to write the model into")
    parser.add_argument("--arch", default="llama", choices=sorted(ARCH_DEFAULTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retrain-tokenizer", action="store_true", help=f"rewrite {TOKENIZER_JSON.name}")
    args = parser.parse_args()
    if args.retrain_tokenizer:
        train_tokenizer().save(str(TOKENIZER_JSON))
        print(f"wrote {TOKENIZER_JSON}")
    if args.path:
        print(f"wrote {build_tiny_model(args.path, arch=args.arch, seed=args.seed)}")


if __name__ == "__main__":
    main()
