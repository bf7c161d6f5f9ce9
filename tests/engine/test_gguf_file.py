"""engine/gguf_file.py on GGUF files written here from a seeded random Llama: hyper-parameters read
from the metadata, tensors dequantized (F32 exact, F16 and Q8_0 as the gguf package rounds them),
llama.cpp's Q/K permutation undone, and clear errors for what cannot load."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, RopeScalingType, TokenType
from gguf.quants import quantize
from safetensors.torch import load_file

from engine import LLM, SamplingParams, gguf_file
from engine.loader import load_config
from engine.structured_output import StructuredOutput
from engine.tiny_model import build_tiny_model
from engine.tokenizer import Tokenizer
from tests.support.gguf_models import add_hparams, add_tokenizer

NAMES = {v: k for k, v in gguf_file._GLOBAL_NAMES.items()}  # HF name -> GGUF name


def _gguf_name(hf: str) -> str:
    if hf in NAMES:
        return NAMES[hf]
    rest = hf.removeprefix("model.layers.")
    layer, _, name = rest.partition(".")
    inverse = {v: k for k, v in gguf_file._LAYER_NAMES.items()}
    return f"blk.{layer}.{inverse[name]}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert script: interleave each head's rotary halves."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NUMPY_TYPES = {GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
                GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64,
                GGMLQuantizationType.F64: np.float64}


def _add_odd(writer: GGUFWriter, name: str, array: np.ndarray, kind: GGMLQuantizationType) -> None:
    """``array`` stored as ``kind`` (a type the gguf package writes but cannot dequantize)."""
    if kind in _NUMPY_TYPES:
        writer.add_tensor(name, array.astype(_NUMPY_TYPES[kind]))
        return
    block, size = GGML_QUANT_SIZES[kind]
    blocks = -(-array.shape[-1] // block)
    writer.add_tensor(name, np.zeros((array.shape[0], blocks * size), dtype=np.uint8), raw_dtype=kind)


def _drop(writer: GGUFWriter, key: str) -> None:
    del writer.kv_data[0][key]


def _write(folder: Path, out: Path, kind: GGMLQuantizationType, extra: dict[str, np.ndarray] | None = None,
           odd: tuple[str, GGMLQuantizationType] | None = None,
           edit: Callable[[GGUFWriter], None] | None = None) -> None:
    """The tiny folder as a GGUF file of ``kind``; ``edit`` changes the metadata (``_drop`` a key first
    to write it anew)."""
    config = load_config(folder)
    weights = load_file(str(folder / "model.safetensors"))
    writer = GGUFWriter(str(out), "llama")
    add_hparams(writer, config)
    rope = config.rope_parameters
    if rope["rope_type"] in ("linear", "yarn"):  # as llama.cpp's converter writes them (llama3: rope_freqs)
        writer.add_rope_scaling_type(RopeScalingType(rope["rope_type"]))
        writer.add_rope_scaling_factor(rope["factor"])
        if rope["rope_type"] == "yarn":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_vocab_size(config.vocab_size)
    add_tokenizer(writer, folder)
    if edit is not None:
        edit(writer)
    for name, tensor in weights.items():
        array = tensor.float().numpy()
        if name.endswith("q_proj.weight"):
            array = _permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, config.num_key_value_heads)
        if odd is not None and _gguf_name(name) == odd[0]:
            _add_odd(writer, odd[0], array, odd[1])
        elif kind is GGMLQuantizationType.F32 or array.ndim == 1:
            writer.add_tensor(_gguf_name(name), array)
        elif kind is GGMLQuantizationType.F16:
            writer.add_tensor(_gguf_name(name), array.astype(np.float16))
        else:
            writer.add_tensor(_gguf_name(name), quantize(array, kind), raw_dtype=kind)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gguf") / "tiny", seed=3)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0])
def test_tensors_come_back_as_the_checkpoint(folder: Path, tmp_path: Path, kind: GGMLQuantizationType) -> None:
    path = tmp_path / f"tiny-{kind.name}.gguf"
    _write(folder, path, kind)
    config = gguf_file.load_config(path)
    original = load_config(folder)
    assert config.architectures == ["LlamaForCausalLM"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(config, key) == getattr(original, key), key
    want = load_file(str(folder / "model.safetensors"))
    got = dict(gguf_file.iter_weights(path, config))
    assert set(got) == set(want) - {"lm_head.weight"} or set(got) == set(want)
    tolerance = {"F32": 0.0, "F16": 1e-3, "Q8_0": 2e-2}[kind.name]
    for name, tensor in got.items():
        assert tensor.dtype == torch.float32 and tensor.shape == want[name].shape, name
        assert torch.allclose(tensor, want[name].float(), atol=tolerance, rtol=0), name


def test_a_tensor_the_engine_has_no_place_for_is_a_clear_error(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    _write(folder, path, GGMLQuantizationType.F32, {"blk.0.mystery.weight": np.zeros(4, dtype=np.float32)})
    with pytest.raises(gguf_file.GGUFError, match="blk.0.mystery.weight"):
        list(gguf_file.iter_weights(path, gguf_file.load_config(path)))


def test_a_missing_or_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(gguf_file.GGUFError, match="does not exist"):
        gguf_file.load_config(tmp_path / "absent.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(gguf_file.GGUFError, match="not a readable GGUF"):
        gguf_file.load_config(broken)


@pytest.mark.parametrize("kind", ["Q8_1", "Q8_K", "I8", "I32", "F64", "Q1_0"])
def test_a_tensor_type_the_gguf_package_cannot_dequantize_is_a_clear_error(
    folder: Path, tmp_path: Path, kind: str
) -> None:
    """Refused before anything is built, by config, engine and iterator alike, naming the tensor
    and its type (and the types that would do)."""
    path = tmp_path / f"odd-{kind}.gguf"
    _write(folder, path, GGMLQuantizationType.F32, odd=("blk.1.ffn_down.weight", GGMLQuantizationType[kind]))
    message = (rf"tensor 'blk.1.ffn_down.weight' has type {kind}, which the gguf package cannot dequantize "
               r"\(it can: F32, F16")
    with pytest.raises(gguf_file.GGUFError, match=message):
        gguf_file.load_config(path)
    with pytest.raises(ValueError, match=message):
        LLM(str(path), max_model_len=64, num_kv_blocks=8)
    with pytest.raises(gguf_file.GGUFError, match=message):
        next(gguf_file.iter_weights(path, load_config(folder)))


def test_a_truncated_file_is_a_clear_error_naming_the_tensor(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    _write(folder, path, GGMLQuantizationType.F32)
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(gguf_file.GGUFError, match=r"GGUF tensor '.+': the file ends inside its data"):
        list(gguf_file.iter_weights(path, gguf_file.load_config(path)))


def test_serving_a_native_gguf_imports_no_compiler_or_modeling_code(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch._dynamo (and triton with it) and transformers' modeling code cost ~150-200 MB of RSS
    each, sympy (LlamaConfig's imports) ~65 MB; the native GGUF path, structured output included,
    needs none of them."""
    path = tmp_path / "tiny.gguf"
    _write(folder, path, GGMLQuantizationType.Q8_0)
    monkeypatch.setenv("SWITCHYARD_GGUF_CACHE", str(tmp_path))
    gguf_file.tokenizer_folder(path)  # built once per file (make install does it for the default model)
    script = (
        "import sys; from engine import LLM, SamplingParams; "
        f"llm = LLM({str(path)!r}, max_model_len=64, num_kv_blocks=8); "
        "from engine.structured_output import StructuredOutput; "
        "json = StructuredOutput('json_object', '', 'response_format'); "
        "llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, structured=json)); "
        "print(sorted(m for m in ('torch._dynamo', 'triton', 'llguidance.torch', "
        "'transformers.modeling_utils', 'sympy') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _llama_cpp_rope_factors(config: Any) -> np.ndarray:
    """What llama.cpp's converter writes as ``rope_freqs.weight`` for a ``rope_type: llama3`` model
    (and no rope-scaling metadata at all)."""
    rope = config.rope_parameters
    dim = config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


ROPES = {
    "llama3": None,  # the tiny Llama's own
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
}


@pytest.mark.parametrize("rope", list(ROPES))
def test_the_rope_scaling_of_the_file_is_applied(
    folder: Path, rope: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp writes linear and yarn scaling as metadata, and a Llama 3.1+ model's as the
    ``rope_freqs`` tensor only: generating from the file gives what the folder it was converted
    from gives (tokens and logprobs)."""
    if ROPES[rope] is not None:
        folder = build_tiny_model(tmp_path / rope, seed=3, rope_scaling=ROPES[rope])
    config = load_config(folder)
    assert config.rope_parameters["rope_type"] == rope
    path = tmp_path / f"{rope}.gguf"
    extra = {"rope_freqs.weight": _llama_cpp_rope_factors(config)} if rope == "llama3" else {}
    _write(folder, path, GGMLQuantizationType.F32, extra)
    monkeypatch.setenv("SWITCHYARD_GGUF_CACHE", str(tmp_path))
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=1, ignore_eos=True)
    prompts = [[(7 * i + 3) % 1000 + 4 for i in range(n)] for n in (40, 90)]
    want, got = (LLM(str(p), max_model_len=128, num_kv_blocks=32).generate(prompts, params) for p in (folder, path))
    for a, b in zip(want, got):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert a.outputs[0].logprobs is not None and b.outputs[0].logprobs is not None
        diffs = [abs(x.logprob - y.logprob) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs)]
        assert max(diffs) < 1e-4


def test_the_end_of_turn_and_end_of_message_tokens_stop_generation(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Llama 3 file's EOS is ``<|end_of_text|>``, while its chat turns end in ``<|eot_id|>``
    (llama.cpp's ``eot_token_id``) or ``<|eom_id|>`` (``eom_token_id``): each stops generation, as
    the Hugging Face generation_config's list of EOS ids does, and a grammar may end on each."""
    tokenizer = Tokenizer(folder)
    eos, eot = tokenizer.token_id("<|end_of_text|>"), tokenizer.token_id("<|eot_id|>")
    eom = tokenizer.token_id("<|start_header_id|>")  # the tiny vocabulary has no <|eom_id|>: a stand-in
    assert eos is not None and eot is not None and eom is not None

    def llama3(writer: GGUFWriter) -> None:
        _drop(writer, "tokenizer.ggml.eos_token_id")
        writer.add_eos_token_id(eos)
        writer.add_eot_token_id(eot)
        writer.add_eom_token_id(eom)

    path = tmp_path / "llama3.gguf"
    _write(folder, path, GGMLQuantizationType.F32, edit=llama3)
    monkeypatch.setenv("SWITCHYARD_GGUF_CACHE", str(tmp_path))
    assert gguf_file.load_config(path).eos_token_id == [eos, eot, eom]
    llm = LLM(str(path), max_model_len=64, num_kv_blocks=16)
    for end in (eos, eot, eom):
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=5, temperature=0, logit_bias={end: 100}))
        assert (out[0].outputs[0].token_ids, out[0].outputs[0].finish_reason) == ([end], "stop"), end
    more_or_end = StructuredOutput("regex", "a+", "structured_outputs")
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=5, temperature=0, logit_bias={eot: 100},
                                                   structured=more_or_end))
    assert out[0].outputs[0].text == "a" and out[0].outputs[0].token_ids[-1] == eot


def _rename_tokens(renames: dict[str, str], normal: tuple[str, ...] = ()) -> Callable[[GGUFWriter], None]:
    """A metadata edit: the tiny vocabulary with tokens renamed (ids kept), the ``normal`` ones (new
    names) as plain-text tokens, every other special token a control token."""
    def edit(writer: GGUFWriter) -> None:
        tokens = [renames.get(t, t) for t in writer.kv_data[0]["tokenizer.ggml.tokens"].value]
        types = writer.kv_data[0]["tokenizer.ggml.token_type"].value
        _drop(writer, "tokenizer.ggml.tokens")
        _drop(writer, "tokenizer.ggml.token_type")
        writer.add_token_list(tokens)
        writer.add_token_types([TokenType.NORMAL if t in normal else k for t, k in zip(tokens, types)])
    return edit


def test_an_end_of_turn_token_the_metadata_does_not_name_stops_generation(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older llama.cpp conversion of Llama 3 names only ``<|end_of_text|>`` (no ``eot_token_id``):
    its ``<|eot_id|>`` control token, which ends each chat turn, stops generation too, as llama.cpp
    finds it by its text."""
    tokenizer = Tokenizer(folder)
    eos, eot = tokenizer.token_id("<|end_of_text|>"), tokenizer.token_id("<|eot_id|>")
    assert eos is not None and eot is not None

    def old_llama3(writer: GGUFWriter) -> None:
        _drop(writer, "tokenizer.ggml.eos_token_id")
        writer.add_eos_token_id(eos)

    path = tmp_path / "llama3-old.gguf"
    _write(folder, path, GGMLQuantizationType.F32, edit=old_llama3)
    monkeypatch.setenv("SWITCHYARD_GGUF_CACHE", str(tmp_path))
    assert gguf_file.load_config(path).eos_token_id == [eos, eot]
    llm = LLM(str(path), max_model_len=64, num_kv_blocks=16)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=5, temperature=0, logit_bias={eot: 100}))
    assert (out[0].outputs[0].token_ids, out[0].outputs[0].finish_reason) == ([eot], "stop")


CHATML = {"<|end_of_text|>": "<|endoftext|>", "<|eot_id|>": "<|im_end|>", "<|start_header_id|>": "<|end|>"}


@pytest.mark.parametrize(("eos_name", "want"), [("<|endoftext|>", ["<|endoftext|>", "<|im_end|>"]),
                                                ("<|im_end|>", ["<|im_end|>", "<|endoftext|>"])])
def test_chatml_end_markers_are_end_of_generation_when_they_are_control_tokens(
    folder: Path, tmp_path: Path, eos_name: str, want: list[str]
) -> None:
    """A Qwen2-style ChatML file's EOS is ``<|endoftext|>`` while its turns end in ``<|im_end|>``;
    both end generation, whichever the metadata names (first, and no id twice), while a plain-text
    token that merely reads ``<|end|>`` does not."""
    tokenizer = Tokenizer(folder)
    ids = {new: tokenizer.token_id(old) for old, new in CHATML.items()}
    eos = ids[eos_name]
    assert eos is not None
    chatml = _rename_tokens(CHATML, normal=("<|end|>",))

    def edit(writer: GGUFWriter) -> None:
        chatml(writer)
        _drop(writer, "tokenizer.ggml.eos_token_id")
        writer.add_eos_token_id(eos)

    path = tmp_path / "chatml.gguf"
    _write(folder, path, GGMLQuantizationType.F32, edit=edit)
    assert gguf_file.load_config(path).eos_token_id == [ids[name] for name in want]


def test_an_eos_that_is_the_only_end_marker_is_kept_alone(folder: Path, tmp_path: Path) -> None:
    """A file whose EOS is its one end-of-turn marker keeps that single id."""
    eot = Tokenizer(folder).token_id("<|eot_id|>")
    path = tmp_path / "only-eot.gguf"
    _write(folder, path, GGMLQuantizationType.F32, edit=_rename_tokens({"<|end_of_text|>": "<|text_end|>"}))
    assert gguf_file.load_config(path).eos_token_id == eot


def test_a_mixture_of_experts_written_as_llama_is_refused_up_front(folder: Path, tmp_path: Path) -> None:
    """Mixtral's files say ``llama`` with ``llama.expert_count``: refused before a tokenizer or a
    model is built, naming why, not at the first expert tensor."""
    path = tmp_path / "mixtral.gguf"
    _write(folder, path, GGMLQuantizationType.F32, {"blk.0.ffn_gate_exps.weight": np.zeros((2, 4, 4), np.float32)},
           edit=lambda writer: writer.add_expert_count(2))
    message = r"mixtral\.gguf: a mixture-of-experts model \(llama\.expert_count = 2"
    with pytest.raises(gguf_file.GGUFError, match=message):
        gguf_file.load_config(path)
    with pytest.raises(gguf_file.GGUFError, match=message):
        gguf_file.tokenizer_folder(path)
    with pytest.raises(ValueError, match=message):
        LLM(str(path), max_model_len=64, num_kv_blocks=8)


def test_an_unsupported_rope_scaling_type_is_a_clear_error(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "longrope.gguf"
    _write(folder, path, GGMLQuantizationType.F32,
           edit=lambda writer: writer.add_string("llama.rope.scaling.type", "longrope"))
    with pytest.raises(gguf_file.GGUFError, match=r"rope scaling type 'longrope' is not supported \(linear, yarn"):
        gguf_file.load_config(path)


def test_named_chat_templates_of_the_file_are_kept(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp writes Hermes' and Command-R's ``tool_use`` template as ``tokenizer.chat_template.tool_use``:
    a request with tools renders it, as from the Hugging Face folder the file came from."""
    tool_use = "TOOL USE {{ tools | tojson }}{% for m in messages %}{{ m['content'] }}{% endfor %}"

    def named(writer: GGUFWriter) -> None:
        writer.add_chat_template([{"name": "tool_use", "template": tool_use}])

    path = tmp_path / "hermes.gguf"
    _write(folder, path, GGMLQuantizationType.F32, edit=named)
    monkeypatch.setenv("SWITCHYARD_GGUF_CACHE", str(tmp_path))
    tokenizer = Tokenizer(gguf_file.tokenizer_folder(path))
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.render_chat(messages, tools=tools) == f"TOOL USE {json.dumps(tools)}hi"
    assert tokenizer.render_chat(messages) == Tokenizer(folder).render_chat(messages)
