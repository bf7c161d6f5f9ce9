"""The logs of ``switchyard serve`` as a process writes them: with ``telemetry.json_logs`` every
line on stderr is a JSON object, the server's own included, to its last one at exit."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import httpx
import pytest

from gateway.db import migrate
from tests.support.fake_upstream import FakeUpstream
from tests.support.serve_process import start_serve

KEY = "sk-json-logs-admin"


@pytest.mark.parametrize("workers", [1, 2])
def test_json_logs_are_json_lines_only_from_start_to_exit(fake_upstream_server: FakeUpstream, tmp_path: Path,
                                                          workers: int) -> None:
    """uvicorn's lines (start-up, the warning a malformed request causes, shutdown; a supervisor's
    too) were plain text among the JSON."""
    url = f"sqlite+aiosqlite:///{tmp_path}/gateway.db"
    migrate.upgrade(url)
    deployment = {"provider": "openai", "model": "e", "api_base": fake_upstream_server.url}
    config = {"database": {"url": url}, "auth": {"admin_key": KEY}, "usage": {"journal_dir": str(tmp_path / "journal")},
              "telemetry": {"json_logs": True}, "models": [{"name": "echo", "deployments": [deployment]}]}
    proc, base, log = start_serve(config, tmp_path, "--workers", str(workers))
    try:
        answer = httpx.post(base + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                            json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200
        with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))) as bad:
            bad.sendall(b"NOT HTTP \x00\r\n\r\n")
            bad.recv(1024)  # the server's 400, then it closes
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()
             if "alembic" not in line]  # the schema check's, through Litestar's root logger: not the server's
    server = [line["message"] for line in lines if line["logger"] == "uvicorn.error"]
    assert sum(m.startswith("Started server process") for m in server) == workers
    assert "Invalid HTTP request received." in server
    assert sum(m.startswith("Finished server process") for m in server) == workers
    assert any(line["logger"] == "switchyard.access" and line["status"] == 200 for line in lines)
