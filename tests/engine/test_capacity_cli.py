"""``switchyard engine capacity`` on a Llama 3.1 8B config (written here; nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gateway.cli import app

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False, "head_dim": 128,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def write_config(tmp_path: Path) -> Path:
    folder = tmp_path / "llama-3.1-8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_31_8B))
    return folder


def invoke(*args: str):
    return CliRunner().invoke(app, ["engine", "capacity", *args])


def test_llama_31_8b_on_80gb(tmp_path: Path) -> None:
    folder = write_config(tmp_path)
    res = invoke("--model", str(folder), "--gpu-memory-gb", "80", "--gpu-memory-utilization", "0.9",
                 "--avg-tokens", "2000")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "16.06 GB" in out and "8,030,261,248 parameters" in out
    assert "128 KiB" in out
    assert "426,784" in out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "3 (x 131,072 tokens)" in lines["sequences, full-context reservation"]
    assert "52 (x 8,192 tokens)" in lines["sequences, capped reservation"]
    assert "213 (avg 2,000 tokens)" in lines["sequences, paged allocation"]


def test_json_and_config_file_and_max_model_len(tmp_path: Path) -> None:
    folder = write_config(tmp_path)
    res = invoke("--model", str(folder / "config.json"), "--json", "--max-model-len", "4096")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["weights_bytes"] == 16_060_522_496
    assert data["kv_bytes_per_token"] == 131072
    assert data["tokens"] == 426_784
    # max_model_len 4096 caps every reservation: 26,674 blocks / 256 blocks per sequence
    assert data["sequences"] == {"full_context": 104, "capped": 104, "paged": 213}


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    res = invoke("--model", str(tmp_path / "missing"))
    assert res.exit_code == 2 and "no config.json" in res.output
    folder = write_config(tmp_path)
    res = invoke("--model", str(folder), "--gpu-memory-gb", "10")
    assert res.exit_code == 2 and "exceed the memory budget" in res.output
    res = invoke("--model", str(folder), "--gpu-memory-utilization", "1.5")
    assert res.exit_code == 2 and "(0, 1]" in res.output


def test_parameter_count_from_config_matches_transformers() -> None:
    import transformers

    from engine.capacity.plan import count_params_from_config

    from .hf_checkpoints import ARCHS

    for arch, make in ARCHS.items():
        config = make()
        model = transformers.AutoModelForCausalLM.from_config(config)
        assert count_params_from_config(config.to_dict()) == model.num_parameters(), arch
