"""compose.yaml, the Dockerfile and deploy/ checked without a Docker engine.

Parsed as YAML and checked for what the deployment needs: services and profiles, health checks,
start-up order, one published port, secrets only through the git-ignored .env, files that exist.
``docker compose config`` runs too where the compose plugin is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
ONE_SHOT = {"migrate"}
_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def _interpolate(value: str) -> str:
    return _DEFAULT.sub(lambda m: m.group(2), value)


def _depends(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on", {})
    return {name: "service_started" for name in deps} if isinstance(deps, list) else \
        {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def test_services_and_profiles() -> None:
    assert {"lb", "gateway", "migrate", "postgres", "redis", "engine", "prometheus", "otel-collector"} <= set(SERVICES)
    profiles = {name: s.get("profiles", []) for name, s in SERVICES.items()}
    assert profiles["engine"] == ["gpu"]
    assert profiles["prometheus"] == profiles["otel-collector"] == ["observability"]
    assert all(not profiles[n] for n in ("lb", "gateway", "migrate", "postgres", "redis"))


def test_every_long_running_service_has_a_health_check() -> None:
    for name, service in SERVICES.items():
        check = service.get("healthcheck", {})
        if name in ONE_SHOT:
            assert service["restart"] == "no" and check.get("disable") is True
            continue
        assert check.get("test") and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert service.get("restart") == "unless-stopped", name


def test_start_up_order() -> None:
    for name, service in SERVICES.items():
        for dep, condition in _depends(service).items():
            assert dep in SERVICES, (name, dep)
            if condition == "service_healthy":
                assert "test" in SERVICES[dep].get("healthcheck", {}), (name, dep)
    gateway = _depends(SERVICES["gateway"])
    assert gateway == {"migrate": "service_completed_successfully", "postgres": "service_healthy",
                       "redis": "service_healthy"}
    assert _depends(SERVICES["migrate"]) == {"postgres": "service_healthy"}
    assert _depends(SERVICES["lb"]) == {"gateway": "service_healthy"}
    assert SERVICES["migrate"]["command"][:3] == ["switchyard", "db", "upgrade"]
    # no cycles: a topological order exists
    pending, done = dict((n, set(_depends(s))) for n, s in SERVICES.items()), set()
    while pending:
        ready = [n for n, deps in pending.items() if deps <= done]
        assert ready, f"dependency cycle among {sorted(pending)}"
        for n in ready:
            done.add(n)
            del pending[n]


def test_replicas_behind_one_published_port() -> None:
    assert int(_interpolate(str(SERVICES["gateway"]["deploy"]["replicas"]))) >= 2
    assert "ports" not in SERVICES["gateway"]  # replicas cannot share a host port; lb publishes it
    published = {n: s["ports"] for n, s in SERVICES.items() if "ports" in s}
    assert _interpolate(published.pop("lb")[0]) == "8000:8000"
    assert all(p.startswith("127.0.0.1:") for ports in published.values() for p in ports)  # local-only extras
    nginx = (ROOT / "deploy/nginx.conf").read_text()
    assert "server gateway:8000" in nginx and "proxy_buffering off" in nginx and "listen 8000" in nginx


def test_gpu_reservation_and_engine_node() -> None:
    engine = SERVICES["engine"]
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    assert devices and devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    assert engine["build"]["args"]["VARIANT"] == "cuda"
    assert "switchyard engine serve" in " ".join(engine["command"])


def test_secrets_only_through_the_ignored_env_file() -> None:
    for name, service in SERVICES.items():
        if "env_file" in service:
            assert [e["path"] for e in service["env_file"]] == [".env"], name
        for key in service.get("environment") or {}:
            assert not re.search(r"PASSWORD|SECRET|KEY|TOKEN", key), (name, key)
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT).returncode == 0
    tracked = subprocess.run(["git", "ls-files", ".env"], cwd=ROOT, capture_output=True, text=True).stdout
    assert ignored and not tracked
    assert ".env" in (ROOT / ".dockerignore").read_text().split()
    example = dict(line.split("=", 1) for line in (ROOT / "deploy/env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert {"POSTGRES_PASSWORD", "SWITCHYARD_ADMIN_KEY"} <= set(example)
    assert all(v in ("", "change-me") or "change-me" in v for v in example.values())


def test_mounted_files_exist_and_the_gateway_config_loads() -> None:
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and source != "./models":
                assert (ROOT / source).is_file(), (name, source)
    env = {"POSTGRES_PASSWORD": "p", "SWITCHYARD_ADMIN_KEY": "a", "SWITCHYARD_ENGINE_API_KEY": "e",
           "SWITCHYARD_SESSION_SECRET": "s"}
    settings = load_settings(ROOT / "deploy/switchyard.yaml", env=env)
    assert settings.redis.url == "redis://redis:6379/0" and "@postgres:5432/" in settings.database.url
    engine_group = next(g for g in settings.models if g.name == "local-llm")
    assert engine_group.strategy == "cache_aware"
    assert all(d.api_base == "http://engine:8100/v1" for d in engine_group.deployments)
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    assert {j["job_name"] for j in prometheus["scrape_configs"]} == {"switchyard-gateway", "switchyard-engine"}
    otel = yaml.safe_load((ROOT / "deploy/otel-collector.yaml").read_text())
    assert otel["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")


def test_dockerfile_is_multi_stage_non_root_with_cpu_and_cuda() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) >= 2 and any(" AS runtime" in s for s in stages)
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] not in ("USER root", "USER 0")
    text = "\n".join(lines)
    assert "ARG VARIANT=cpu" in text and "cpu)" in text and "cuda)" in text
    assert "COPY --from=build" in text
    pin = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin and f"ARG TORCH_VERSION={pin.group(1)}" in text  # the image installs the pinned torch
    for line in lines:
        if line.startswith("COPY ") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src


@pytest.mark.skipif(shutil.which("docker") is None or subprocess.run(
    ["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed here")
def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    shutil.copy(ROOT / "compose.yaml", tmp_path)
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    shutil.copy(ROOT / "deploy/env.example", tmp_path / ".env")  # env_file: .env is required
    for profiles in ([], ["--profile", "gpu", "--profile", "observability"]):
        result = subprocess.run(["docker", "compose", *profiles, "config", "--quiet"], cwd=tmp_path,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
