"""A config reload builds its new backends off the event loop: while a local engine deployment is
being built (its weights loading), requests to the other models are answered, and the new model
serves once the reload is done."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.base import Backend
from backends.config import DeploymentConfig
from backends.factory import build_backend
from backends.providers import PROVIDERS
from engine.tiny_model import build_tiny_model
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.support.reload_gateway import reloadable_gateway

HELD = "held-local"  # a provider: the local engine, its build held until the test lets it finish
building = threading.Event()  # a held build has begun
release = threading.Event()  # ... and may finish


def build_held(config: DeploymentConfig) -> Backend:
    """``provider: local``, as if its weights took until ``release`` to load (at most 30 s)."""
    building.set()
    release.wait(30)
    return build_backend(DeploymentConfig(provider="local", model=config.model, name=config.name,
                                          options=config.options))


def _chat(url: str, model: str, timeout: float = 10) -> int:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-user"},
                      timeout=timeout).status_code


@pytest.fixture
def gateway(fake_upstream_server: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    monkeypatch.setitem(PROVIDERS, HELD, f"{__name__}:build_held")
    building.clear()
    release.clear()
    echo = {"provider": "openai", "model": "m", "api_base": fake_upstream_server.url, "api_key": "sk-up"}
    config = {"auth": {"admin_key": ADMIN_KEY}, "models": [{"name": "echo", "deployments": [echo]}]}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        with reloadable_gateway(path) as server:
            yield server.url, path, config
    finally:
        release.set()  # never leave a build waiting


def test_requests_are_answered_while_a_reload_loads_a_local_model(
    gateway: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    url, path, config = gateway
    _with_tiny(path, config, build_tiny_model(tmp_path / "tiny", seed=5, max_position_embeddings=256))
    with ThreadPoolExecutor(1) as pool:
        reload = pool.submit(httpx.post, url + "/admin/v1/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                             timeout=60)
        assert building.wait(30), "the reload never began building the local deployment"
        try:
            assert _chat(url, "echo", timeout=5) == 200  # answered while the weights still load
            assert not reload.done()
        finally:
            release.set()
        answer = reload.result()
    assert answer.status_code == 200 and answer.json()["models"] == ["echo", "tiny"], answer.text
    assert _chat(url, "tiny") == 200 and _chat(url, "echo") == 200


def _with_tiny(path: Path, config: dict[str, Any], folder: Path) -> None:
    """Write the config file with the tiny model added as ``tiny``, built by the held provider."""
    local = {"provider": HELD, "model": str(folder), "options": {"num_kv_blocks": 32, "block_size": 16}}
    path.write_text(yaml.safe_dump(config | {"models": [*config["models"], {"name": "tiny", "deployments": [local]}]}))


def test_a_reload_whose_caller_left_still_completes(gateway: tuple[str, Path, dict[str, Any]], tmp_path: Path) -> None:
    """An admin client that stops waiting does not abandon the reload half-built."""
    url, path, config = gateway
    _with_tiny(path, config, build_tiny_model(tmp_path / "tiny", seed=5, max_position_embeddings=256))
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /admin/v1/reload HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_KEY}\r\n"
                     "content-length: 0\r\n\r\n".encode())
        assert building.wait(30), "the reload never began building the local deployment"
    time.sleep(0.2)  # the gateway sees the client gone
    release.set()
    deadline = time.monotonic() + 30
    while _chat(url, "tiny") != 200:
        assert time.monotonic() < deadline, "the reload was abandoned when its caller left"
        time.sleep(0.05)
