"""Router and backend factory: names and aliases, weighted picks, provider registry errors."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from backends.factory import build_backend, register_provider
from backends.openai_http import OpenAIHTTPBackend
from gateway.router import Deployment, ModelGroup, Router
from gateway.settings import ConfigError, DeploymentConfig, ModelGroupConfig, parse_settings


def _group(weights: list[float], seed: int = 0) -> ModelGroup:
    deployments = [DeploymentConfig(provider="openai", model=f"m{i}", weight=w) for i, w in enumerate(weights)]
    config = ModelGroupConfig(name="g", aliases=["g-alias"], deployments=deployments)
    return ModelGroup(config, [Deployment(d, object()) for d in deployments], rng=random.Random(seed))  # type: ignore[arg-type]


def test_pick_follows_weights() -> None:
    group = _group([3.0, 1.0])
    counts = Counter(group.pick().id for _ in range(4000))  # type: ignore[union-attr]
    assert counts["openai:m0"] > 2 * counts["openai:m1"] > 0


def test_resolve_names_and_aliases() -> None:
    router = Router([_group([1.0])])
    assert router.resolve("g") is router.resolve("g-alias") is router.groups[0]
    assert router.resolve("G") is None


def test_router_from_settings_builds_openai_backends() -> None:
    settings = parse_settings({"models": [{"name": "a", "deployments": [
        {"provider": "openai", "model": "x", "api_base": "http://127.0.0.1:1/v1"}]}]}, env={})
    router = Router.from_settings(settings, build_backend)
    assert isinstance(router.groups[0].deployments[0].backend, OpenAIHTTPBackend)


def test_missing_provider_module_is_a_config_error() -> None:
    register_provider("openai", "backends.not_written_yet:Backend")
    try:
        with pytest.raises(ConfigError, match="not available"):
            build_backend(DeploymentConfig(provider="openai", model="x"))
    finally:
        register_provider("openai", "backends.openai_http:OpenAIHTTPBackend")
