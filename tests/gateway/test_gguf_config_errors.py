"""A ``local`` deployment whose GGUF file holds a tensor type the gguf package cannot dequantize is a
config error naming the tensor and its type: a 400 from POST /admin/v1/reload (the running table
stays), one line and exit status 2 from ``switchyard serve``; never a 500 or a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from gguf import GGUFWriter

from tests.conftest import ADMIN_KEY
from tests.support.reload_gateway import reloadable_gateway
from tests.support.servers import ServerThread, free_port

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def _gguf_with_int8_weights(path: Path) -> Path:
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((8, 8), dtype=np.int8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _config(models: list[dict]) -> str:
    return yaml.safe_dump({"auth": {"admin_key": ADMIN_KEY}, "models": models})


REMOTE = {"name": "remote", "deployments": [{"provider": "openai", "model": "m", "api_base": "http://127.0.0.1:9"}]}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[ServerThread, Path]]:
    path = tmp_path / "config.yaml"
    path.write_text(_config([REMOTE]))
    with reloadable_gateway(path) as server:
        yield server, path


def test_reload_onto_an_undequantizable_gguf_is_a_400_naming_the_tensor(
    gateway: tuple[ServerThread, Path], tmp_path: Path
) -> None:
    server, path = gateway
    model = _gguf_with_int8_weights(tmp_path / "int8.gguf")
    local = {"name": "odd", "deployments": [{"provider": "local", "model": str(model),
                                             "options": {"max_model_len": 64, "num_kv_blocks": 8}}]}
    path.write_text(_config([REMOTE, local]))
    answer = httpx.post(server.url + "/admin/v1/reload", headers=ADMIN, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_config"
    assert "tensor 'blk.0.attn_q.weight' has type I8, which the gguf package cannot dequantize" in error["message"]
    assert "Traceback" not in answer.text
    models = httpx.get(server.url + "/v1/models", headers=ADMIN).json()["data"]
    assert [m["id"] for m in models] == ["remote"]  # the running table stays


def test_serve_with_an_undequantizable_gguf_says_so_in_one_line(tmp_path: Path) -> None:
    model = _gguf_with_int8_weights(tmp_path / "int8.gguf")
    local = {"name": "odd", "deployments": [{"provider": "local", "model": str(model),
                                             "options": {"max_model_len": 64, "num_kv_blocks": 8}}]}
    config = yaml.safe_load(_config([local])) | {"database": {"url": f"sqlite+aiosqlite:///{tmp_path}/gw.db"},
                                                 "usage": {"journal_dir": str(tmp_path / "journal")}}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    exe = Path(sys.executable).parent / "switchyard"
    subprocess.run([str(exe), "bootstrap", "--config", str(path)], cwd=tmp_path, check=True, capture_output=True)
    done = subprocess.run([str(exe), "serve", "--config", str(path), "--port", str(free_port())], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: deployment ") and last.endswith(")")
    assert "int8.gguf: tensor 'blk.0.attn_q.weight' has type I8, which the gguf package cannot dequantize" in last
