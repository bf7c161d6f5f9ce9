"""``scheduling: fair`` on a local deployment: the gateway hands each request's tenant and weight
to the engine, which reports per-tenant figures (admin API) and per-weight-class metrics."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from backends.factory import build_backend
from backends.local import LocalEngineBackend
from backends.local.options import engine_config
from engine.tiny_model import build_tiny_model
from gateway.contracts import Principal
from gateway.settings import ConfigError, DeploymentConfig, parse_settings
from tests.support.scripted_gateway import scripted_gateway

KEYS = {
    "sk-light": Principal(key_id="k1", tenant_id="light", tenant_weight=1.0),
    "sk-heavy": Principal(key_id="k2", tenant_id="heavy", tenant_weight=3.0),
    "sk-admin": Principal(key_id="adm", tenant_id=None, is_admin=True),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalEngineBackend]]:
    folder = build_tiny_model(tmp_path_factory.mktemp("fair") / "tiny", seed=3, max_position_embeddings=512)
    deployment = {"provider": "local", "model": str(folder),
                  "options": {"num_kv_blocks": 64, "block_size": 16, "scheduling": "fair", "max_num_seqs": 2}}
    settings = parse_settings({"auth": {"admin_key": "sk-admin-unused"},
                               "models": [{"name": "tiny", "deployments": [deployment], "max_retries": 0}]}, env={})
    built: list[LocalEngineBackend] = []

    def factory(cfg: DeploymentConfig):  # type: ignore[no-untyped-def]
        built.append(build_backend(cfg))
        return built[-1]

    with scripted_gateway(settings, KEYS, build=factory) as server:
        yield server.url, built[0]


def _ask(url: str, key: str, i: int) -> int:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    out = client.completions.create(model="tiny", prompt=f"request {i} about trains", max_tokens=6,
                                    extra_body={"ignore_eos": True})
    return out.usage.completion_tokens


def test_tenants_reach_the_engine_and_are_reported(gateway: tuple[str, LocalEngineBackend]) -> None:
    url, backend = gateway
    assert backend.engine.engine.config.scheduling_policy == "fair"
    jobs = [("sk-light", i) for i in range(3)] + [("sk-heavy", i) for i in range(3)]
    with ThreadPoolExecutor(6) as pool:
        done = list(pool.map(lambda job: _ask(url, *job), jobs))
    assert all(n > 0 for n in done)
    figures = backend.engine_metrics().tenants
    assert figures["light"].weight == 1.0 and figures["heavy"].weight == 3.0
    assert figures["light"].tokens_scheduled > 0 and figures["heavy"].tokens_scheduled > 0
    assert all(f.num_waiting == 0 and f.num_running == 0 for f in figures.values())

    admin = httpx.get(url + "/admin/v1/engine/tenants", headers={"Authorization": "Bearer sk-admin"})
    assert admin.status_code == 200
    rows = {r["tenant_id"]: r for r in admin.json()["data"]}
    assert rows["heavy"]["weight"] == 3.0 and rows["heavy"]["tokens_scheduled"] == figures["heavy"].tokens_scheduled
    denied = httpx.get(url + "/admin/v1/engine/tenants", headers={"Authorization": "Bearer sk-light"})
    assert denied.status_code == 403 and "error" in denied.json()

    text = httpx.get(url + "/metrics").text
    assert 'switchyard_engine_tokens_scheduled_by_weight_class_total{model_name="local:' in text
    assert 'weight_class="3"' in text and 'weight_class="1"' in text
    assert "heavy" not in text and "light" not in text  # no tenant ids as labels


def test_scheduling_option_is_checked(tmp_path: Path) -> None:
    def cfg(options: dict) -> DeploymentConfig:
        return DeploymentConfig(name="d", provider="local", model=str(tmp_path), options=options)

    assert engine_config(cfg({"scheduling": "fcfs"})).scheduling_policy == "fcfs"
    assert engine_config(cfg({"scheduling": "fair"})).scheduling_policy == "fair"
    with pytest.raises(ConfigError, match="scheduling must be one of"):
        engine_config(cfg({"scheduling": "lottery"}))
