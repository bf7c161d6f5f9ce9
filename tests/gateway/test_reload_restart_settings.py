"""A reload that changes settings only a restart applies (server, database, Redis, auth, ...): the
change is named in the reload's answer (``restart_required``) and in one warning line, not silently
dropped; models and prices still change at once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.support.reload_gateway import reloadable_gateway
from tests.support.servers import ServerThread

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def _config(upstream: str, **sections: Any) -> dict[str, Any]:
    dep = {"provider": "openai", "model": "m", "api_base": upstream, "api_key": "sk-up"}
    return {"auth": {"admin_key": ADMIN_KEY}, "models": [{"name": "echo", "deployments": [dep]}], **sections}


@pytest.fixture
def gateway(fake_upstream_server: FakeUpstream, tmp_path: Path) -> Iterator[tuple[ServerThread, Path]]:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_config(fake_upstream_server.url)))
    with reloadable_gateway(path) as server:
        yield server, path


def test_a_reload_names_the_settings_that_need_a_restart(
    gateway: tuple[ServerThread, Path], fake_upstream_server: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    server, path = gateway
    changed = _config(fake_upstream_server.url, server={"port": 9123, "max_body_bytes": 2048},
                      redis={"url": "redis://127.0.0.1:6390/0"})
    changed["models"][0]["aliases"] = ["echo-2"]
    path.write_text(yaml.safe_dump(changed))
    with caplog.at_level(logging.WARNING, logger="switchyard.reload"):
        r = httpx.post(server.url + "/admin/v1/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["models"] == ["echo"]
    assert r.json()["restart_required"] == ["redis.url", "server.max_body_bytes", "server.port"]
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "switchyard.reload"
                and rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "server.port" in warnings[0] and "restart" in warnings[0], warnings
    models = httpx.get(server.url + "/v1/models", headers=ADMIN, timeout=10).json()["data"]
    assert "echo-2" in {m["id"] for m in models}  # the reloadable part took effect

    path.write_text(yaml.safe_dump(_config(fake_upstream_server.url)))  # back as it started
    r = httpx.post(server.url + "/admin/v1/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 200 and r.json()["restart_required"] == [], r.text
