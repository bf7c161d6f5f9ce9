"""``switchyard serve --workers 2`` as real processes: workers that cannot start end the supervisor
(one ``error:`` line, non-zero status) instead of leaving it alive serving nothing; a worker that
dies after start-up is replaced."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.gateway.test_gguf_config_errors import _gguf_with_int8_weights
from tests.support.serve_process import worker_pids
from tests.support.servers import free_port

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")
ECHO = {"name": "echo", "deployments": [{"provider": "openai", "model": "e", "api_base": "http://127.0.0.1:9"}]}


def _config(tmp_path: Path, models: list[dict]) -> Path:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({
        "auth": {"admin_key": "sk-workers-test"}, "models": models,
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path}/gw.db"}, "usage": {"journal_dir": str(tmp_path / "j")},
    }))
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(path)], cwd=tmp_path, check=True, capture_output=True)
    return path


def _serve(config: Path, port: int) -> list[str]:
    return [SWITCHYARD, "serve", "--config", str(config), "--port", str(port), "--workers", "2"]


def test_workers_that_cannot_load_a_model_end_the_supervisor_with_the_config_error(tmp_path: Path) -> None:
    model = _gguf_with_int8_weights(tmp_path / "int8.gguf")
    config = _config(tmp_path, [{"name": "odd", "deployments": [
        {"provider": "local", "model": str(model), "options": {"max_model_len": 64, "num_kv_blocks": 8}}]}])
    done = subprocess.run(_serve(config, free_port()), cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: deployment ")
    assert "tensor 'blk.0.attn_q.weight' has type I8" in last


def test_workers_whose_start_up_fails_end_the_supervisor_naming_the_error(tmp_path: Path) -> None:
    """The database passes the supervisor's schema check, but a table the workers' start-up reads
    is gone: each worker's lifespan fails, and the supervisor exits with that error."""
    config = _config(tmp_path, [ECHO])
    with sqlite3.connect(tmp_path / "gw.db") as db:
        db.execute("drop table model_prices")
    done = subprocess.run(_serve(config, free_port()), cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: a worker failed at start-up: OperationalError: ") and "model_prices" in last


def test_a_worker_killed_after_start_up_is_replaced(tmp_path: Path) -> None:
    config = _config(tmp_path, [ECHO])
    port = free_port()
    proc = subprocess.Popen(_serve(config, port), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/healthz"

    def healthy() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        deadline = time.monotonic() + 90
        while len(worker_pids(proc.pid)) < 2 or not healthy():
            assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)
        time.sleep(1)  # both workers past start-up
        first = worker_pids(proc.pid)
        os.kill(min(first), signal.SIGKILL)
        while len(worker_pids(proc.pid) - first) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "the killed worker was not replaced"
            time.sleep(0.2)
        assert healthy() and proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
