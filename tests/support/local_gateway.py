"""A gateway on loopback over the in-process engine (the built-in tiny model), with in-memory
doubles for keys, admission and usage: what the local-backend tests talk to with the openai SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from backends.factory import build_backend
from backends.local import LocalEngineBackend
from engine.tiny_model import build_tiny_model
from gateway.contracts import Principal
from gateway.settings import DeploymentConfig, parse_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

KEY = "sk-test-local"


@dataclass
class Env:
    server: ServerThread
    backend: LocalEngineBackend
    usage: RecordingSink
    folder: Path
    admission: ScriptedAdmission

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key=KEY, max_retries=0)

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the engine runs nothing and holds no KV blocks (or fail after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.backend.engine_metrics()
            if m.num_running == 0 and m.num_waiting == 0 and m.kv_usage == 0.0:
                return
            time.sleep(0.02)
        raise AssertionError(f"engine still busy: {self.backend.engine_metrics()}")


@contextmanager
def local_gateway(workdir: Path, extra_models: list[dict[str, Any]] | None = None, model: str | None = None,
                  prices: dict[str, Any] | None = None, **options: Any) -> Iterator[Env]:
    """The tiny model (seed 5, 2048 positions) served as model ``tiny``; ``options`` are the
    deployment's engine options (default: 192 KV blocks of 16, prefix caching off); ``extra_models``
    are more model groups (``{folder}`` in a deployment's ``model`` is the tiny model's folder);
    ``model`` serves that folder or .gguf file as ``tiny`` instead; ``prices`` is the config's
    ``prices`` (default: none, every request free)."""

    folder = Path(model) if model else build_tiny_model(workdir / "tiny", seed=5, max_position_embeddings=2048)
    options = {"num_kv_blocks": 192, "block_size": 16, "enable_prefix_caching": False, **options}
    deployment = {"provider": "local", "model": str(folder), "options": options}
    models = [{"name": "tiny", "deployments": [deployment], "max_retries": 0}]
    for group in extra_models or []:
        for d in group["deployments"]:
            d["model"] = d["model"].replace("{folder}", str(folder))
        models.append(group)
    settings = parse_settings({"auth": {"admin_key": "sk-admin-unused"}, "models": models, "prices": prices or {}},
                              env={})
    built: list[LocalEngineBackend] = []

    def factory(cfg: DeploymentConfig) -> Any:
        backend = build_backend(cfg)
        built.append(backend)  # type: ignore[arg-type]  # a local deployment builds a LocalEngineBackend
        return backend

    usage, admission = RecordingSink(), ScriptedAdmission()
    keys = {KEY: Principal(key_id="k", tenant_id="t", is_admin=True)}
    with scripted_gateway(settings, keys, admission=admission, usage=usage, build=factory) as server:
        yield Env(server, built[0], usage, folder, admission)
