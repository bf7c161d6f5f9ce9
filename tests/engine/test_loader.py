"""Loader round-trips from saved HF folders: single file, sharded, bf16; clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.attention_metadata import AttentionMetadata
from engine.config import EngineConfig, parse_dtype
from engine.loader import ModelLoadError, load_model, model_kv_shape, safetensors_files
from engine.tiny_model import build_tiny_model, ensure_tiny_model


def forward_logits(model, cfg, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    layers, kv_heads, head_dim = model_kv_shape(cfg)
    dtype = next(model.parameters()).dtype
    caches = [torch.zeros(2, 4, 16, kv_heads, head_dim, dtype=dtype) for _ in range(layers)]
    n = len(ids)
    meta = AttentionMetadata(torch.arange(n), torch.tensor([[0, 1, 2, 3]], dtype=torch.int32),
                             torch.tensor([n], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32), n, n, 16)
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(n), caches, meta))


def test_sharded_checkpoint_round_trip(tmp_path: Path) -> None:
    single = build_tiny_model(tmp_path / "single", arch="qwen3", seed=7)
    sharded = build_tiny_model(tmp_path / "sharded", arch="qwen3", seed=7, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(safetensors_files(sharded)) > 1
    a, cfg = load_model(single, torch.float32, "cpu")
    b, _ = load_model(sharded, "float32", "cpu")
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name


def test_bf16_checkpoint_and_dtype_choice(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path, arch="llama", seed=2, dtype=torch.bfloat16)
    ids = [3, 50, 200, 7, 9, 11]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        model, cfg = load_model(path, dtype, "cpu")
        assert {p.dtype for p in model.parameters()} == {dtype}
        logits = forward_logits(model, cfg, ids)
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    # float32 compute on the bf16 weights equals transformers in float32 on the same weights
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(forward_logits(model, cfg, ids), want, atol=1e-4, rtol=1e-4)


def test_model_kv_shape(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path, arch="qwen3", num_hidden_layers=3, num_key_value_heads=1)
    _, cfg = load_model(path, torch.float32, "cpu")
    assert model_kv_shape(cfg) == (3, 1, 32)


def test_missing_folder_and_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope", torch.float32, "cpu")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path, torch.float32, "cpu")
    path = build_tiny_model(tmp_path / "m")
    for f in path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_model(path, torch.float32, "cpu")


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["LlamaForSequenceClassification"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported architecture.*native models"):
        load_model(path, torch.float32, "cpu")


def test_bad_dtype() -> None:
    """One dtype table and parser (engine.config) for the config, the loader and the planner."""
    import engine.loader

    assert engine.loader.parse_dtype is parse_dtype
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        parse_dtype("int8")
    with pytest.raises(ValueError, match="unsupported dtype torch.int8"):
        EngineConfig("unused", dtype=torch.int8)  # rejected up front, not when the model loads
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype(torch.float16) is torch.float16


def test_ensure_tiny_model_builds_once(tmp_path: Path) -> None:
    path = ensure_tiny_model(tmp_path / "models" / "tiny")
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(path) == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == ["tiny"]  # no staging folder left behind
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "stray.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not a complete model folder"):
        ensure_tiny_model(broken)


def test_other_safetensors_beside_the_checkpoint_are_not_loaded(tmp_path: Path) -> None:
    """As transformers: model.safetensors (or the index's shards) is the checkpoint; Mistral's
    consolidated.safetensors or a LoRA adapter in the same folder is neither loaded nor counted."""
    from safetensors.torch import save_file

    from engine.capacity.plan import count_params_from_safetensors

    single = build_tiny_model(tmp_path / "single", arch="mistral", seed=4)
    sharded = build_tiny_model(tmp_path / "sharded", arch="mistral", seed=4, max_shard_size="40KB")
    want = count_params_from_safetensors(single)
    ref, _ = load_model(single, torch.float32, "cpu")
    for folder in (single, sharded):
        for name in ("consolidated.safetensors", "adapter_model.safetensors"):
            save_file({"layers.0.attention.wq.weight": torch.zeros(64, 64)}, str(folder / name))
        index = folder / "model.safetensors.index.json"
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else []
        assert [f.name for f in safetensors_files(folder)] == (shards or ["model.safetensors"])
        model, _ = load_model(folder, torch.float32, "cpu")
        for (name, a), (_, b) in zip(ref.state_dict().items(), model.state_dict().items(), strict=True):
            assert torch.equal(a, b), name
        assert count_params_from_safetensors(folder) == want
