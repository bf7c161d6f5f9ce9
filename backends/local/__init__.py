"""Provider ``local``: a model folder served by Switchyard's own engine in this process.

Deployment ``options`` are engine arguments in vLLM's spelling: ``dtype``, ``device``,
``block_size``, ``gpu_memory_utilization``, ``kv_cache_bytes``, ``num_kv_blocks``,
``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, ``enable_prefix_caching``,
``enable_chunked_prefill``, ``scheduling_policy``, ``attn_backend``, ``model_impl``, ``seed``;
plus ``builtin: tiny`` to generate the built-in tiny model into the ``model`` folder when it is
missing (what the embedded default config uses, so ``make run`` needs no download).
"""

from __future__ import annotations

import dataclasses
import logging
from backends.local.backend import LocalEngineBackend
from engine import AsyncEngine, EngineConfig
from engine.loader import ModelLoadError
from gateway.settings import ConfigError, DeploymentConfig

log = logging.getLogger("switchyard.backends.local")

_OPTIONS = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"} | {"builtin"}


def engine_config(config: DeploymentConfig) -> EngineConfig:
    """The ``EngineConfig`` for a deployment; ConfigError names what is wrong."""
    options = dict(config.options)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ConfigError(f"deployment {config.id}: unknown options {unknown} (known: {sorted(_OPTIONS)})")
    builtin = options.pop("builtin", None)
    if builtin is not None:
        if builtin != "tiny":
            raise ConfigError(f"deployment {config.id}: options.builtin must be 'tiny', got {builtin!r}")
        from engine.tiny_model import ensure_tiny_model

        ensure_tiny_model(config.model)
    if config.context_window is not None and "max_model_len" not in options:
        options["max_model_len"] = config.context_window
    try:
        return EngineConfig(model=config.model, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"deployment {config.id}: {exc}") from None


def build_backend(config: DeploymentConfig) -> LocalEngineBackend:
    """Factory entry for ``provider: local``: load the model; the engine loop starts on first use."""
    engine_cfg = engine_config(config)
    from backends.hf_fallback import generate_fallback  # models only plain transformers generate can run

    if (plain := generate_fallback(config, engine_cfg.model_impl, dict(config.options))) is not None:
        return plain  # type: ignore[return-value]
    try:
        engine = AsyncEngine(engine_cfg)
    except (ModelLoadError, ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"deployment {config.id}: {exc}") from None
    log.info("deployment %s: %s loaded, max_model_len=%d", config.id, config.model, engine.max_model_len)
    return LocalEngineBackend(engine, config.model, config.id)


__all__ = ["LocalEngineBackend", "build_backend", "engine_config"]
