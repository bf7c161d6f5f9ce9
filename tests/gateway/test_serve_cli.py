"""``switchyard serve`` as a user runs it: a subprocess on a free port, then the openai SDK."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli import app
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


def test_reload_endpoint_restarts_every_worker_when_there_are_several(tmp_path: Path, upstream: FakeUpstream) -> None:
    """With --workers 2, POST /admin/v1/reload checks the file, then the supervisor replaces both
    workers on it: afterwards every answer, whichever worker gives it, shows the new model. A
    ``server`` key that the supervisor applies (not the new workers) is named as needing a restart."""
    config = tmp_path / "config.yaml"
    raw = {
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path}/sy.db"},
        "auth": {"admin_key": "sk-cli-test"},
        "models": [{"name": "echo", "deployments": [{"provider": "openai", "model": "e", "api_base": upstream.url}]}],
    }
    config.write_text(yaml.safe_dump(raw))
    env = os.environ | {"SWITCHYARD__USAGE__JOURNAL_DIR": str(tmp_path / "journal")}
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(config)], env=env, check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([SWITCHYARD, "serve", "--config", str(config), "--port", str(port), "--workers", "2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    admin = {"Authorization": "Bearer sk-cli-test"}
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        config.write_text("models: [not, a, model]\n")
        bad = httpx.post(url + "/admin/v1/reload", headers=admin, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_config"
        raw["models"][0]["name"] = "echo-renamed"
        raw["server"] = {"body_timeout": 12.5, "max_body_bytes": 2_000_000}  # the workers apply the latter
        config.write_text(yaml.safe_dump(raw))
        answer = httpx.post(url + "/admin/v1/reload", headers=admin, timeout=10).json()
        assert answer == {"models": ["echo-renamed"], "workers_restarting": True,
                          "restart_required": ["server.body_timeout"]}

        def model_ids() -> list[str]:  # a new connection each time: either worker may answer
            with httpx.Client(headers=admin, timeout=5) as client:
                return [m["id"] for m in client.get(url + "/v1/models").json()["data"]]

        deadline, in_a_row = time.monotonic() + 60, 0
        while in_a_row < 20:
            assert time.monotonic() < deadline, "the workers were not all restarted on the new file"
            try:
                in_a_row = in_a_row + 1 if model_ids() == ["echo-renamed"] else 0
            except httpx.HTTPError:
                in_a_row = 0
            time.sleep(0.05)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert b"server.body_timeout changed in the config file" in proc.stderr.read()  # type: ignore[union-attr]


def test_serve_rejects_a_bad_config_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("server:\n  port: many\n")
    result = subprocess.run([SWITCHYARD, "serve", "--config", str(config)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "server.port" in result.stderr


def test_serve_without_config_takes_switchyard_config_as_the_admin_commands_do(tmp_path: Path) -> None:
    config = tmp_path / "from-env.yaml"
    config.write_text("server:\n  port: many\n")
    result = subprocess.run([SWITCHYARD, "serve"], capture_output=True, text=True,
                            env={**os.environ, "SWITCHYARD_CONFIG": str(config)})
    assert result.returncode == 2 and "from-env.yaml" in result.stderr and "server.port" in result.stderr


def test_echo_config_routes_to_the_echo_upstream_make_run_starts() -> None:
    settings = load_settings(ROOT / "config/echo.yaml", env={})
    assert settings.models[0].name == "echo"
    assert settings.models[0].deployments[0].api_base == "http://127.0.0.1:8001/v1"
    assert "http://127.0.0.1:8001" in (ROOT / "Makefile").read_text()


def _make_run_offline(tmp_path: Path, config: Path) -> tuple[int, list[str]]:
    """``make run CONFIG=config`` with the Makefile as shipped, on a machine where the default model
    cannot be fetched: the venv's python and switchyard are stand-ins that log their arguments (the
    fetch fails as without network)."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    for name, fail_on in (("python", "backends.local.default_model"), ("switchyard", "")):
        script = venv / "bin" / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n'
                          + (f'case "$*" in *{fail_on}*) echo "could not fetch" >&2; exit 1;; esac\n' if fail_on
                             else "") + "exit 0\n")
        script.chmod(0o755)
    # the Makefile's stamp of an installed venv: $(VENV)/.installed-<cksum of pyproject.toml>
    digest = subprocess.run("cat pyproject.toml | cksum | cut -d' ' -f1", shell=True, cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    (venv / f".installed-{digest}").touch()
    done = subprocess.run(["make", "-s", f"VENV={venv}", f"CONFIG={config}", "run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, log.read_text().splitlines() if log.exists() else []


def test_make_run_needs_the_default_model_only_when_the_config_serves_it(tmp_path: Path) -> None:
    """README: without network, put a .gguf file there, or point the deployment's `model:` at any
    local file; `make run CONFIG=config/echo.yaml` needs no model weights."""
    rc, calls = _make_run_offline(tmp_path / "default", ROOT / "config/default.yaml")
    assert rc != 0 and not any(c.startswith("switchyard") for c in calls), calls  # the fetch failed: stop
    own = tmp_path / "own.yaml"
    own.write_text((ROOT / "config/default.yaml").read_text().replace(
        "${SWITCHYARD_MODELS:-~/.cache/switchyard/models}/SmolLM2-135M-Instruct.Q4_1.gguf", "/models/mine.gguf"))
    assert "/models/mine.gguf" in own.read_text()
    for config in (own, ROOT / "config/echo.yaml"):
        rc, calls = _make_run_offline(tmp_path / config.stem, config)
        assert rc == 0, calls
        assert not any("backends.local.default_model" in c for c in calls), calls
        assert f"switchyard bootstrap --config {config}" in calls and f"switchyard serve --config {config}" in calls


@pytest.mark.parametrize(("option", "value"), [("--port", "70000"), ("--port", "-5"),
                                               ("--header-timeout", "inf"), ("--header-timeout", "3601")])
def test_serve_refuses_an_option_out_of_range_before_serving(tmp_path: Path, option: str, value: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """--port 70000 once bound port 4464 (70000 mod 65536) while logging 70000; --header-timeout inf
    once served with no deadline at all (server.header_timeout lies in (0, 3600])."""
    monkeypatch.setattr("gateway.cli.serve._check_database", lambda url: pytest.fail("went on to serve"))
    config = tmp_path / "c.yaml"
    config.write_text("models: []\n")
    done = CliRunner().invoke(app, ["serve", "--config", str(config), option, value])
    assert done.exit_code == 2 and option in done.stderr, done.output


def test_serve_on_a_port_in_use_fails_at_once_before_the_app_starts(tmp_path: Path) -> None:
    """Not after the app's start-up (a local model's load may take minutes), and in one line."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"database": {"url": f"sqlite+aiosqlite:///{tmp_path}/sy.db"}, "models": []}))
    env = os.environ | {"SWITCHYARD__USAGE__JOURNAL_DIR": str(tmp_path / "journal")}
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(config)], env=env, check=True, capture_output=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for workers in ("1", "2"):
            done = subprocess.run([SWITCHYARD, "serve", "--config", str(config), "--port", str(port), "--workers",
                                   workers], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
            assert done.returncode == 1, done.stderr
            assert done.stderr.strip().splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: "
                                                        "Address already in use"], done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_warns_of_a_price_that_prices_nothing_once(tmp_path: Path, upstream: FakeUpstream, workers: str) -> None:
    """The server loads its config once in ``serve`` and again in each worker: one warning a price all the same."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path}/sy.db"}, "usage": {"journal_dir": str(tmp_path / "j")},
        "models": [{"name": "echo", "aliases": ["echo-latest"],
                    "deployments": [{"provider": "openai", "model": "e", "api_base": upstream.url}]}],
        "prices": {"echo-latest": {"input_per_million": 1.0}, "gone": {"input_per_million": 1.0}},
    }))
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(config)], check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([SWITCHYARD, "serve", "--config", str(config), "--port", str(port), "--workers", workers],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    warned = [line for line in stderr.decode().splitlines() if "names no model or deployment" in line]
    assert len(warned) == 2, warned
    assert "prices.echo-latest" in warned[0] and "prices.gone" in warned[1], warned


def test_serve_names_a_usage_journal_dir_it_cannot_use(tmp_path: Path) -> None:
    """Not "no such file" with exit 1 from a worker's start-up: the key to fix, as a config error."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"database": {"url": f"sqlite+aiosqlite:///{tmp_path}/sy.db"}, "models": []}))
    (tmp_path / "a-file").write_text("")
    env = os.environ | {"SWITCHYARD__USAGE__JOURNAL_DIR": str(tmp_path / "a-file" / "journal")}
    subprocess.run([SWITCHYARD, "db", "upgrade", "--config", str(config)], env=env, check=True, capture_output=True)
    done = subprocess.run([SWITCHYARD, "serve", "--config", str(config), "--port", str(free_port())], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: config error at usage.journal_dir: cannot use {tmp_path / 'a-file' / 'journal'} as a folder "
        "(Not a directory)"), done.stderr
