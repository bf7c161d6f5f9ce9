"""Reloading a broken config file (POST /admin/v1/reload and SIGHUP): a file that is not UTF-8, or
one that would leave a gateway serving models with none (empty, truncated), is refused with a 400
``invalid_config`` and one log line, and the previous config keeps serving."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml

from gateway.reload import Reloader
from gateway.settings import ConfigError, load_settings
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.support.reload_gateway import reloadable_gateway
from tests.support.servers import ServerThread

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
NOT_UTF8 = b"\xff\xfe\x00bad"


def _config(upstream: str) -> dict[str, Any]:
    dep = {"provider": "openai", "model": "m", "api_base": upstream, "api_key": "sk-up"}
    return {"auth": {"admin_key": ADMIN_KEY}, "models": [{"name": "echo", "deployments": [dep]}]}


@pytest.fixture(scope="module")
def gateway(fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ServerThread, Path]]:
    path = tmp_path_factory.mktemp("reload-config") / "gw.yaml"
    path.write_text(yaml.safe_dump(_config(fake_upstream_server.url)))
    with reloadable_gateway(path) as server:
        yield server, path


def _chat(server: ServerThread) -> int:
    body = {"model": "echo", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    return httpx.post(server.url + "/v1/chat/completions", json=body,
                      headers={"authorization": "Bearer sk-user"}, timeout=10).status_code


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(NOT_UTF8)
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(path, env={})


@pytest.mark.parametrize("content", [NOT_UTF8, b"", b"# truncated\n"], ids=["not-utf8", "empty", "no-models"])
def test_a_broken_file_is_refused_and_the_old_config_stays(
    gateway: tuple[ServerThread, Path], content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server, path = gateway
    good = path.read_bytes()
    try:
        path.write_bytes(content)
        with caplog.at_level(logging.ERROR, logger="switchyard.reload"):
            r = httpx.post(server.url + "/admin/v1/reload", headers=ADMIN, timeout=10)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_config" and str(path) in r.json()["error"]["message"]
        refusals = [rec for rec in caplog.records if rec.name == "switchyard.reload"]
        assert len(refusals) == 1 and refusals[0].exc_info is None and "\n" not in refusals[0].getMessage()
        assert _chat(server) == 200  # still served by the previous config
    finally:
        path.write_bytes(good)
    assert httpx.post(server.url + "/admin/v1/reload", headers=ADMIN, timeout=10).status_code == 200
    assert _chat(server) == 200


@pytest.mark.parametrize("content", [NOT_UTF8, b""], ids=["not-utf8", "empty"])
async def test_sighup_with_a_broken_file_logs_one_line(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_config("http://127.0.0.1:9")))
    settings = load_settings(path, env={})
    router = SimpleNamespace(reload=lambda *_: pytest.fail("the routing table must not change"))
    pipeline: Any = SimpleNamespace(settings=settings, services=SimpleNamespace(router=router, on_reload=[]))
    path.write_bytes(content)
    with caplog.at_level(logging.INFO, logger="switchyard.reload"):
        await Reloader(pipeline, path)._on_sighup()  # what the event loop calls on SIGHUP, and its reload
    lines = [rec for rec in caplog.records if rec.name == "switchyard.reload"]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR and lines[0].exc_info is None, lines
    assert "keeping the previous config" in lines[0].getMessage()
    assert pipeline.settings is settings


async def test_a_gateway_without_models_may_reload_an_empty_file(tmp_path: Path) -> None:
    """Nothing is lost: a gateway that serves no models yet accepts a file that defines none."""
    path = tmp_path / "gw.yaml"
    path.write_text("")
    settings = load_settings(path, env={})

    async def reload(*_: object) -> None:
        pass

    pipeline: Any = SimpleNamespace(settings=settings, services=SimpleNamespace(router=SimpleNamespace(reload=reload),
                                                                                on_reload=[]))
    assert (await Reloader(pipeline, path).reload()).models == []
