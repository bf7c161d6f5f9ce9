"""Defaults that are right on a GPU and unchanged on the CPU: ``dtype: auto`` and ``attn_backend:
auto`` (Triton, hence CUDA graphs, on CUDA; the C++ kernel or torch on the CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine import LLM
from engine import config as engine_config
from engine.config import EngineConfig, auto_dtype, checkpoint_dtype, resolve_attn_backend, resolve_dtype

from .hf_checkpoints import checkpoint  # noqa: F401  (fixture)


def test_auto_dtype_is_fp32_on_cpu_and_the_checkpoints_half_dtype_on_gpu() -> None:
    assert auto_dtype(False, torch.bfloat16) == torch.float32
    assert auto_dtype(True, torch.bfloat16) == torch.bfloat16
    assert auto_dtype(True, torch.float16) == torch.float16
    assert auto_dtype(True, torch.float32) == torch.bfloat16  # vLLM's rule: no fp32 GEMMs by default
    assert auto_dtype(True, None) == torch.bfloat16
    assert auto_dtype(True, torch.bfloat16, bf16_supported=False) == torch.float16


@pytest.mark.parametrize("field", ["torch_dtype", "dtype"])
def test_checkpoint_dtype_reads_config_json(tmp_path: Path, field: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({field: "bfloat16"}))
    assert checkpoint_dtype(str(tmp_path)) == torch.bfloat16
    (tmp_path / "config.json").write_text(json.dumps({field: "int8"}))
    assert checkpoint_dtype(str(tmp_path)) is None
    assert checkpoint_dtype(str(tmp_path / "missing")) is None


def test_engine_config_defaults_on_cpu(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    cfg = EngineConfig(model=str(tmp_path))
    assert cfg.dtype == "auto" and cfg.torch_dtype == torch.float32
    assert EngineConfig(model=str(tmp_path), dtype="bfloat16").torch_dtype == torch.bfloat16
    assert resolve_dtype("float16", "cuda", str(tmp_path)) == torch.float16
    with pytest.raises(ValueError, match="unsupported dtype"):
        EngineConfig(model=str(tmp_path), dtype="int8")


def test_auto_backend_on_cuda_is_triton_unless_it_cannot_build(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_attn_backend("auto", "cuda") == "triton"
    assert resolve_attn_backend("auto", "cuda:1") == "triton"
    monkeypatch.setenv("CC", "")
    monkeypatch.setattr(engine_config.shutil, "which", lambda name: None)  # no C compiler for the launcher
    assert resolve_attn_backend("auto", "cuda") == "torch"
    assert resolve_attn_backend("triton", "cuda") == "triton"  # asked for: it fails loudly where it runs


@pytest.mark.parametrize("model_impl", ["native", "transformers"])
def test_decode_attention_probe_runs_the_torch_backend_at_full_length(checkpoint, model_impl: str) -> None:
    """What the CUDA memory profile adds for attn_backend='torch': one layer's decode at
    max_num_seqs x max_model_len (here on the CPU, where it only has to run)."""
    llm = LLM(str(checkpoint("llama")), attn_backend="torch", model_impl=model_impl, max_num_seqs=3,
              max_model_len=64, num_kv_blocks=16, block_size=16)
    runner = llm.engine.runner
    assert runner.decode_attention_probe() == 2 * 4 * 16 * 2 * 16 * 4  # [2, 4 blocks, 16, 2 heads, 16] fp32


def test_capacity_plan_uses_the_engines_gpu_dtype() -> None:
    from engine.capacity.plan import gpu_dtype

    assert gpu_dtype(None, "float32") == torch.bfloat16  # what dtype auto runs on a GPU
    assert gpu_dtype("auto", "float16") == torch.float16
    assert gpu_dtype(None, None) == torch.bfloat16
    assert gpu_dtype("float32", "bfloat16") == torch.float32
