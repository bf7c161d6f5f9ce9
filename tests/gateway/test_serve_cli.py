"""``switchyard serve`` as a user runs it: a subprocess on a free port, then the openai SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import yaml

from gateway.settings import load_settings
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")
ROOT = Path(__file__).resolve().parents[2]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("gateway did not become healthy")


def test_serve_round_trip(tmp_path: Path, upstream: FakeUpstream) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path}/sy.db"},
        "auth": {"admin_key": "${CLI_TEST_KEY}"},
        "models": [{"name": "echo", "deployments": [{"provider": "openai", "model": "e", "api_base": upstream.url}]}],
    }))
    env = os.environ | {"CLI_TEST_KEY": "sk-cli-test", "SWITCHYARD__USAGE__JOURNAL_DIR": str(tmp_path / "journal")}
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(config)], env=env, check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([SWITCHYARD, "serve", "--config", str(config), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-cli-test", max_retries=0)
        reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "via the cli"}])
        assert reply.choices[0].message.content == "via the cli"
        assert httpx.get(url + "/readyz").json()["status"] == "ready"
        # SIGHUP re-reads the file: a renamed model shows up without a restart
        raw = yaml.safe_load(config.read_text())
        raw["models"][0]["name"] = "echo-renamed"
        config.write_text(yaml.safe_dump(raw))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while [m.id for m in client.models.list().data] != ["echo-renamed"]:
            assert time.monotonic() < deadline, "SIGHUP did not reload the config"
            time.sleep(0.1)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_rejects_a_bad_config_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("server:\n  port: many\n")
    result = subprocess.run([SWITCHYARD, "serve", "--config", str(config)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "server.port" in result.stderr


def test_echo_config_routes_to_the_echo_upstream_make_run_starts() -> None:
    settings = load_settings(ROOT / "config/echo.yaml", env={})
    assert settings.models[0].name == "echo"
    assert settings.models[0].deployments[0].api_base == "http://127.0.0.1:8001/v1"
    assert "http://127.0.0.1:8001" in (ROOT / "Makefile").read_text()
