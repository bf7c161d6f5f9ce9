"""Provider ``local``: a model folder served by Switchyard's own engine in this process.

Deployment ``options`` are engine arguments in vLLM's spelling: ``dtype``, ``device``,
``block_size``, ``gpu_memory_utilization``, ``kv_cache_bytes``, ``num_kv_blocks``,
``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, ``enable_prefix_caching``,
``enable_chunked_prefill``, ``scheduling_policy``, ``attn_backend``, ``model_impl``, ``seed``;
``scheduling: fcfs | fair`` (fair: weighted fair admission and preemption across the gateway's
tenants, by each tenant's weight); ``pooling: last | mean`` (the deployment also serves
``/v1/embeddings``: the final hidden states pooled, normalised); ``tool_call_parser: auto | hermes |
llama3 | mistral`` (how tool calls are read from the model's text; auto picks from the chat
template); plus ``builtin: tiny`` to generate
the built-in tiny model into the ``model`` folder when it is missing (what the embedded default
config uses, so ``make run`` needs no download).

Importing this package is cheap; torch and the engine load when a backend is built.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import msgspec

from backends.config import ConfigError, DeploymentConfig

if TYPE_CHECKING:
    from backends.local.backend import LocalEngineBackend

log = logging.getLogger("switchyard.backends.local")


def build_backend(config: DeploymentConfig) -> LocalEngineBackend:
    """Factory entry for ``provider: local``: load the model; the engine loop starts on first use."""
    from backends.local.backend import LocalEngineBackend
    from backends.local.options import engine_config, pooling_params, tool_call_parser
    from engine import AsyncEngine
    from engine.loader import ModelLoadError

    config = msgspec.structs.replace(config, model=os.path.expanduser(config.model))  # "~/..." in a config file
    engine_cfg = engine_config(config)
    from backends.transformers_generate import generate_fallback  # models only plain transformers generate can run

    if (plain := generate_fallback(config, engine_cfg.model_impl, dict(config.options))) is not None:
        return plain  # type: ignore[return-value]
    log.info("deployment %s: loading %s ...", config.id, config.model)  # a progress line: loading takes a while
    started = time.monotonic()
    try:
        engine = AsyncEngine(engine_cfg)
    except (ModelLoadError, ValueError, FileNotFoundError) as exc:
        raise ConfigError(f"deployment {config.id}: {exc}") from None
    log.info("deployment %s: %s loaded in %.1f s, max_model_len=%d", config.id, config.model,
             time.monotonic() - started, engine.max_model_len)
    return LocalEngineBackend(engine, config.model, config.id, pooling=pooling_params(config),
                              tool_parser=tool_call_parser(config))


def __getattr__(name: str) -> Any:
    if name == "LocalEngineBackend":
        from backends.local.backend import LocalEngineBackend

        return LocalEngineBackend
    raise AttributeError(name)


__all__ = ["LocalEngineBackend", "build_backend"]
