"""Models in one GGUF file (llama.cpp's format), as vLLM and transformers load them.

``model`` may name a ``.gguf`` file wherever it may name a Hugging Face folder. The architecture and
hyper-parameters come from the file's metadata (transformers maps them onto its config class), the
weights are dequantized at load with the ``gguf`` package (every type it can dequantize: F32, F16,
BF16, Q8_0, Q4_0, Q4_1, the K-quants, ...) into the engine's dtype and renamed onto the Hugging Face
names the native models load, with the Q/K row permutation llama.cpp applies to Llama-family
attention undone. The tokenizer (vocabulary, merges, special tokens) and chat template are built
from the metadata once and kept as a tokenizer folder in ``SWITCHYARD_GGUF_CACHE`` (default
``~/.cache/switchyard/gguf``). Architectures the engine does not implement natively go to the
transformers path (``engine.model_impl``), which reads the same file.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, TokenType, dequantize
from transformers import PretrainedConfig

from engine.gguf_header import GGUFHeader, TensorInfo, read_header
from engine.layers.rotary import rope_parameters

GGUF_SUFFIX = ".gguf"
_PERMUTED_ARCHS = {"llama", "mistral"}  # llama.cpp's converter permutes their q/k rows
_NATIVE_ARCHS = _PERMUTED_ARCHS | {"qwen2", "qwen3"}  # whose attention.key_length is the config's head_dim
_FOLDER_FORMAT = 2  # of the tokenizer folders built from files: a new format builds them anew
_SLICE_BYTES = 16 << 20  # float32 output per slice of rows while dequantizing
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
# token texts llama.cpp's llama-vocab.cpp ends generation on besides the metadata's EOS/EOT/EOM ids
_END_MARKERS = frozenset({"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                          "<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>"})
_ADDED_TYPES = {TokenType.CONTROL, TokenType.USER_DEFINED}  # whole added tokens, not plain-text pieces
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}


class GGUFError(ValueError):
    """A GGUF file the engine cannot load (a tensor type or name it does not know, a bad file)."""


def is_gguf(model: str | Path) -> bool:
    return str(model).endswith(GGUF_SUFFIX)


def header(path: str | Path) -> GGUFHeader:
    """The file's metadata and tensor table (a few MB; the weights stay in the file)."""
    file = Path(path)
    if not file.is_file():
        raise GGUFError(f"GGUF file {str(path)!r} does not exist")
    stat = file.stat()
    return _header(str(file.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _header(path: str, size: int, mtime_ns: int) -> GGUFHeader:  # size and mtime: a rewritten file is re-read
    try:
        return read_header(path)
    except (ValueError, OSError) as exc:  # GGUFFormatError, or mmap of an empty file
        raise GGUFError(f"{path}: not a readable GGUF file ({exc})") from None


def architecture(path: str | Path) -> str:
    return str(header(path).get("general.architecture", "unknown"))


@functools.cache
def _can_dequantize(type_id: int) -> bool:
    """Whether the gguf package dequantizes this tensor type (tried on one block of zeros)."""
    try:
        kind = GGMLQuantizationType(type_id)
        block_bytes = GGML_QUANT_SIZES[kind][1]
        dequantize(np.zeros((1, block_bytes), dtype=np.uint8), kind)
    except (ValueError, KeyError, NotImplementedError):
        return False
    return True


def check_tensor_types(head: GGUFHeader) -> None:
    """Raise GGUFError naming the first tensor whose type the gguf package cannot dequantize."""
    for tensor in head.tensors:
        if not _can_dequantize(tensor.type_id):
            known = ", ".join(k.name for k in GGMLQuantizationType if _can_dequantize(k))
            raise GGUFError(f"{head.path.name}: tensor {tensor.name!r} has type {tensor.type_name}, which the gguf "
                            f"package cannot dequantize (it can: {known})")


def check_loadable(head: GGUFHeader) -> None:
    """Raise GGUFError for a file that cannot load, before anything is built from it: a tensor type
    that cannot be dequantized, or a mixture of experts written as a dense architecture (Mixtral's
    files say ``llama`` with ``llama.expert_count``), whose expert tensors neither the native model
    nor transformers' GGUF reader (which maps the architecture onto its dense class) has a place for."""
    arch = str(head.get("general.architecture"))
    if arch in _NATIVE_ARCHS and (experts := int(head.get(f"{arch}.expert_count") or 0)) > 0:
        raise GGUFError(f"{head.path.name}: a mixture-of-experts model ({arch}.expert_count = {experts}, as "
                        f"Mixtral's files are written): neither the native {arch} model nor transformers' GGUF "
                        "reader loads expert layers for this architecture; serve it from its Hugging Face folder")
    check_tensor_types(head)


class GGUFLlamaConfig(PretrainedConfig):
    """A llama-architecture file's config, with LlamaConfig's defaults for what the file does not
    say. Not LlamaConfig itself: importing that pulls in torch.distributed and sympy (~65 MB of
    RSS) that the native model does not need."""

    model_type = "llama"


def _rope_scaling(head: GGUFHeader, arch: str) -> dict[str, Any]:
    """The rope type and scaling the file's ``{arch}.rope.scaling.*`` metadata asks for (transformers'
    GGUF mapping drops them for the native architectures)."""
    kind = head.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return {"rope_type": "default"}
    if kind not in ("linear", "yarn"):
        raise GGUFError(f"{head.path.name}: rope scaling type {kind!r} is not supported (linear, yarn are)")
    params: dict[str, Any] = {"rope_type": kind, "factor": float(head.get(f"{arch}.rope.scaling.factor", 1.0))}
    if kind == "yarn" and (original := head.get(f"{arch}.rope.scaling.original_context_length")) is not None:
        params["original_max_position_embeddings"] = int(original)
    return params


def _llama_config(head: GGUFHeader) -> Any:
    """The config straight from a llama-architecture file's metadata."""
    value = head.get
    heads, hidden = int(value("llama.attention.head_count")), int(value("llama.embedding_length"))
    vocab = value("llama.vocab_size") or len(value("tokenizer.ggml.tokens", ()))
    fields: dict[str, Any] = dict(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(value("llama.feed_forward_length")),
        num_hidden_layers=int(value("llama.block_count")), num_attention_heads=heads,
        num_key_value_heads=int(value("llama.attention.head_count_kv", heads)),
        head_dim=int(value("llama.attention.key_length", hidden // heads)), hidden_act="silu",
        rms_norm_eps=float(value("llama.attention.layer_norm_rms_epsilon", 1e-6)), attention_bias=False,
        mlp_bias=False, rope_parameters={"rope_theta": float(value("llama.rope.freq_base", 10000.0)),
                                         **_rope_scaling(head, "llama")},
        max_position_embeddings=int(value("llama.context_length", 2048)),
        bos_token_id=value("tokenizer.ggml.bos_token_id"),
        architectures=["LlamaForCausalLM"],
    )
    return GGUFLlamaConfig(**fields)


@functools.lru_cache(maxsize=8)
def load_config(path: str | Path) -> Any:
    """The transformers config the file's metadata describes: read directly for Llama files, else by
    transformers' GGUF mapping (which parses the whole vocabulary: seconds), with the rope scaling and
    head_dim it drops put back; llama.cpp's ``rope_freqs`` factors are added to the rope parameters, and
    its end-of-turn ids to ``eos_token_id``.
    Raises GGUFError first for a file ``check_loadable`` refuses."""
    from transformers import AutoConfig

    file = Path(path)
    head = header(file)
    check_loadable(head)
    arch = str(head.get("general.architecture"))
    if arch == "llama":
        config = _llama_config(head)
    else:
        try:
            config = AutoConfig.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
        except (ValueError, KeyError, OSError) as exc:
            raise GGUFError(f"{file}: transformers cannot read its architecture ({exc})") from None
        if arch in _NATIVE_ARCHS:  # what transformers' mapping drops for them
            config.rope_parameters = {**rope_parameters(config), **_rope_scaling(head, arch)}
            if (key_length := head.get(f"{arch}.attention.key_length")) is not None:
                config.head_dim = int(key_length)  # qwen3's
    if (eos := _eos_token_id(head)) is not None:
        config.eos_token_id = eos
    names = {t.name for t in head.tensors}
    if "rope_freqs.weight" in names:
        config.rope_parameters = {**rope_parameters(config), "freq_factors": _rope_freq_factors(head)}
    config.tie_word_embeddings = "output.weight" not in names  # no separate output matrix: tied to the embeddings
    if not getattr(config, "architectures", None):  # the causal-LM class, as a folder's config.json names it
        from transformers import AutoModelForCausalLM

        cls: Any = AutoModelForCausalLM._model_mapping.get(type(config), None)
        config.architectures = [cls.__name__] if cls is not None else []
    return config


def _eos_token_id(head: GGUFHeader) -> int | list[int] | None:
    """The ids that end generation, as a Hugging Face config lists them: EOS, and llama.cpp's end of
    turn and end of message (Llama 3's ``<|eot_id|>``, ``<|eom_id|>``), which a chat model writes at
    the end of its answer while its EOS is ``<|end_of_text|>``; then the vocabulary's end-of-turn
    markers, which older conversions do not name (see ``_end_markers``)."""
    named = [int(v) for key in _END_KEYS if (v := head.get(key)) is not None]
    ids = list(dict.fromkeys(named + _end_markers(head)))
    return None if not ids else ids[0] if len(ids) == 1 else ids


def _end_markers(head: GGUFHeader) -> list[int]:
    """The ids of the tokens whose text is an end-of-turn marker (Qwen2's ``<|im_end|>`` beside its EOS
    ``<|endoftext|>``, Gemma's ``<end_of_turn>``, Phi-3's ``<|end|>``, ...), as llama.cpp finds them:
    only added tokens (control or user-defined) where the file gives token types, never a plain-text
    piece that reads the same."""
    tokens, types = head.get("tokenizer.ggml.tokens", ()), head.get("tokenizer.ggml.token_type")
    ids = [i for i, text in enumerate(tokens) if text in _END_MARKERS]
    if types is not None:
        ids = [i for i in ids if i < len(types) and int(types[i]) in _ADDED_TYPES]
    return ids


def _rope_freq_factors(head: GGUFHeader) -> list[float]:
    """The ``rope_freqs`` tensor: llama.cpp's per-dimension rope factors, which its converter writes for
    Llama 3.1+ (``rope_type: llama3``) instead of any rope-scaling metadata."""
    tensor = next(t for t in head.tensors if t.name == "rope_freqs.weight")
    fd = os.open(head.path, os.O_RDONLY)
    try:
        return [float(x) for x in _read_dequantized(fd, tensor).flatten()]
    finally:
        os.close(fd)


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of each head's rotary halves (its ``permute`` in convert)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER.fullmatch(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise GGUFError(f"GGUF tensor {name!r} has no place in the native model")
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"


def _read_dequantized(fd: int, tensor: TensorInfo) -> torch.Tensor:
    """The tensor in float32, read from the file and dequantized a slice of rows at a time (the
    file's bytes are never all in memory, and the only full-size array is the result)."""
    cols, row_bytes = tensor.shape[-1], tensor.row_bytes()
    rows = math.prod(tensor.shape[:-1])
    out = torch.empty((rows, cols), dtype=torch.float32)
    target = out.numpy()
    step = max(1, _SLICE_BYTES // (cols * 4))
    kind = GGMLQuantizationType(tensor.type_id)
    for first in range(0, rows, step):
        count = min(step, rows - first)
        raw = os.pread(fd, count * row_bytes, tensor.offset + first * row_bytes)
        if len(raw) != count * row_bytes:
            raise GGUFError(f"GGUF tensor {tensor.name!r}: the file ends inside its data (truncated download?)")
        target[first:first + count] = dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(count, row_bytes), kind)
    return out.reshape(tensor.shape)


def iter_weights(
    path: str | Path, hf_config: Any, dtype: torch.dtype = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(Hugging Face name, tensor in dtype)`` for every tensor of the file, dequantized one at a
    time, largest first: the caller copies each into the model's parameters, so beside the model
    about one tensor is ever held, and the largest while little of the model is yet in memory."""
    head = header(path)
    check_loadable(head)
    permuted = str(head.get("general.architecture")) in _PERMUTED_ARCHS
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    fd = os.open(head.path, os.O_RDONLY)
    try:
        for tensor in sorted(head.tensors, key=lambda t: -math.prod(t.shape)):
            if tensor.name == "rope_freqs.weight":
                continue  # llama 3.1's rope factors: load_config put them in rope_parameters
            name = _hf_name(tensor.name)
            weight = _read_dequantized(fd, tensor)
            if permuted and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
                weight = _unpermute(weight, heads if "attn_q" in tensor.name else kv_heads)
            yield name, weight.to(dtype)
            del weight  # freed before the next tensor is read (in another dtype it is a second copy)
    finally:
        os.close(fd)


def _save_named_templates(head: GGUFHeader, folder: Path) -> None:
    """llama.cpp's named chat templates (``tokenizer.chat_template.tool_use``, ``.rag``: Hermes,
    Command-R), which transformers' GGUF reader drops, where transformers saves named templates."""
    for key, source in head.metadata.items():
        name = key.removeprefix("tokenizer.chat_template.")
        if name != key and isinstance(source, str) and re.fullmatch(r"\w+", name):
            (folder / "additional_chat_templates").mkdir(exist_ok=True)
            (folder / "additional_chat_templates" / f"{name}.jinja").write_text(source, encoding="utf-8")


def tokenizer_folder(path: str | Path) -> Path:
    """A Hugging Face tokenizer folder built from the file's metadata (once; then reused). Building
    it parses the whole vocabulary through transformers' GGUF reader (seconds, ~150 MB at its peak),
    so engines ask for it before loading weights; a file that cannot load at all fails first."""
    check_loadable(header(path))
    file = Path(path).resolve()
    stat = file.stat()
    key = hashlib.sha256(f"{file}:{stat.st_size}:{stat.st_mtime_ns}:{_FOLDER_FORMAT}".encode()).hexdigest()[:16]
    root = Path(os.environ.get("SWITCHYARD_GGUF_CACHE") or Path.home() / ".cache" / "switchyard" / "gguf")
    folder = root / f"{file.stem}-{key}"
    if (folder / "tokenizer.json").is_file():
        return folder
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise GGUFError(f"{file}: cannot build its tokenizer from the metadata ({exc})") from None
    partial = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tokenizer.save_pretrained(str(partial))
    _save_named_templates(header(path), partial)
    try:
        partial.replace(folder)
    except OSError:  # another process built it first
        shutil.rmtree(partial, ignore_errors=True)
    return folder
