"""GGUF files of the native architectures other than Llama (Qwen2 with its q/k/v biases, Qwen3 with
q/k norms and a head_dim that is not hidden_size / heads), written here as llama.cpp's converter lays
them out: generating from the file gives what generating from the folder it came from gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, get_tensor_name_map
from safetensors.numpy import load_file

from engine import LLM, SamplingParams
from engine.loader import load_config
from engine.tiny_model import build_tiny_model
from tests.support.gguf_models import add_hparams, add_tokenizer

ARCHS = {"qwen2": MODEL_ARCH.QWEN2, "qwen3": MODEL_ARCH.QWEN3}


def write_gguf(folder: Path, arch: str, out: Path) -> Path:
    config = load_config(folder)
    writer = GGUFWriter(str(out), MODEL_ARCH_NAMES[ARCHS[arch]])
    add_hparams(writer, config)
    if (head_dim := getattr(config, "head_dim", None)) is not None:  # as the converter: only when the config has one
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    add_tokenizer(writer, folder)
    names = get_tensor_name_map(ARCHS[arch], config.num_hidden_layers)
    for hf_name, array in load_file(str(folder / "model.safetensors")).items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        writer.add_tensor(name, np.ascontiguousarray(array.astype(np.float32)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("arch", list(ARCHS))
def test_generating_from_the_file_equals_the_folder(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = build_tiny_model(tmp_path / arch, arch=arch, seed=1)
    path = write_gguf(folder, arch, tmp_path / f"{arch}.gguf")
    monkeypatch.setenv("SWITCHYARD_GGUF_CACHE", str(tmp_path / "cache"))
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=1, ignore_eos=True)
    prompts = [[(7 * i + 3) % 900 + 4 for i in range(n)] for n in (20, 50)]
    want = LLM(str(folder), max_model_len=128, num_kv_blocks=32).generate(prompts, params)
    got = LLM(str(path), max_model_len=128, num_kv_blocks=32).generate(prompts, params)
    for a, b in zip(want, got):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert a.outputs[0].logprobs is not None and b.outputs[0].logprobs is not None
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs)) < 1e-5
