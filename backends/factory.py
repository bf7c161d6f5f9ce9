"""Build a Backend from a DeploymentConfig, by its provider's entry in ``backends.providers``.

The builder's module is imported only when a deployment needs it, so a gateway that only talks to
HTTP upstreams never imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from backends.base import Backend
from backends.config import ConfigError, DeploymentConfig
from backends.providers import PROVIDERS

BackendBuilder = Callable[[DeploymentConfig], Backend]


def _resolve(provider: str) -> BackendBuilder:
    target = PROVIDERS.get(provider)
    if target is None:
        raise ConfigError(f"unknown provider {provider!r} (known: {', '.join(sorted(PROVIDERS))})")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(
                f"provider {provider!r} is not available in this installation (module {module_name} is missing)"
            ) from None
        raise
    builder = getattr(module, attr, None)
    if builder is None:
        raise ConfigError(f"provider {provider!r}: {module_name} has no {attr}")
    return builder


def build_backend(config: DeploymentConfig) -> Backend:
    """A ready-to-use Backend for one deployment; ConfigError when its provider is unavailable."""
    return _resolve(config.provider)(config)
