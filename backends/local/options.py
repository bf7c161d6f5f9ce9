"""Deployment ``options`` -> ``EngineConfig`` (with the built-in tiny model made on demand)."""

from __future__ import annotations

import dataclasses

from backends.config import ConfigError, DeploymentConfig
from engine import EngineConfig, InvalidRequest, PoolingParams

OPTIONS = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"} | {
    "builtin", "scheduling", "pooling", "tool_call_parser"}
SCHEDULING = ("fcfs", "fair")  # ``scheduling``: first come first served, or weighted fair across tenants


def engine_config(config: DeploymentConfig) -> EngineConfig:
    """The ``EngineConfig`` for a deployment; ConfigError names what is wrong."""
    options = dict(config.options)
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ConfigError(f"deployment {config.id}: unknown options {unknown} (known: {sorted(OPTIONS)})")
    options.pop("pooling", None)  # the backend's (pooling_params)
    options.pop("tool_call_parser", None)  # the backend's (tool_call_parser)
    builtin = options.pop("builtin", None)
    if builtin is not None:
        if builtin != "tiny":
            raise ConfigError(f"deployment {config.id}: options.builtin must be 'tiny', got {builtin!r}")
        from engine.tiny_model import ensure_tiny_model

        try:
            ensure_tiny_model(config.model)
        except OSError as exc:
            raise ConfigError(f"deployment {config.id}: cannot build the tiny model: {exc}") from None
    if (scheduling := options.pop("scheduling", None)) is not None:
        if scheduling not in SCHEDULING or "scheduling_policy" in options:
            raise ConfigError(f"deployment {config.id}: options.scheduling must be one of {list(SCHEDULING)} "
                              f"(and not given with scheduling_policy), got {scheduling!r}")
        options["scheduling_policy"] = scheduling
    if config.context_window is not None and "max_model_len" not in options:
        options["max_model_len"] = config.context_window
    try:
        return EngineConfig(model=config.model, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"deployment {config.id}: {exc}") from None


def pooling_params(config: DeploymentConfig) -> PoolingParams | None:
    """``options.pooling`` (``last`` or ``mean``): the deployment also serves ``/v1/embeddings``,
    pooling the final hidden states that way (normalised); None: it serves no embeddings."""
    pooling = config.options.get("pooling")
    if pooling is None:
        return None
    try:
        return PoolingParams(pooling=pooling)
    except InvalidRequest as exc:
        raise ConfigError(f"deployment {config.id}: options.{exc.message}") from None


def tool_call_parser(config: DeploymentConfig) -> str:
    """``options.tool_call_parser``: ``auto`` (default: from the chat template's markers),
    ``hermes``, ``llama3`` or ``mistral``."""
    from backends.local.tool_parsers import PARSERS

    name = config.options.get("tool_call_parser", "auto")
    if name != "auto" and name not in PARSERS:
        raise ConfigError(f"deployment {config.id}: options.tool_call_parser must be auto or one of "
                          f"{sorted(PARSERS)}, got {name!r}")
    return str(name)
