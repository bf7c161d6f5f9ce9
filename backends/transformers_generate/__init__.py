"""Provider ``transformers``: a local HF folder (or GGUF file) served by plain ``model.generate``.

Deployment options (all optional): ``dtype`` (float32), ``device`` (cpu), ``max_batch_size``
(rows per ``generate`` call, 8), ``max_queue`` (requests waiting before Unavailable, 64),
``max_model_len`` (the model's ``max_position_embeddings``). This provider always uses the
plain path; ``provider: local`` comes here by itself for models the engine cannot run
(``generate_fallback``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from backends.config import ConfigError, DeploymentConfig
from backends.transformers_generate.backend import HFGenerateBackend

log = logging.getLogger("switchyard.backends.transformers")

_OPTIONS = {"dtype", "device", "max_batch_size", "max_queue", "max_model_len"}


def _int_option(options: dict[str, Any], name: str, default: int, deployment: str) -> int:
    value = options.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"deployment {deployment}: options.{name} must be a positive integer, got {value!r}")
    return value


def load_generate_backend(folder: str, deployment_id: str, options: dict[str, Any],
                          context_window: int | None = None, reason: str = "") -> HFGenerateBackend:
    """Load ``folder`` with transformers and wrap it in an ``HFGenerateBackend``."""
    import torch
    import transformers

    from engine import gguf_file
    from engine.config import parse_dtype
    from engine.model_impl import ModelImplError, inspect_model

    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ConfigError(f"deployment {deployment_id}: unknown options {unknown} (known: {sorted(_OPTIONS)})")
    gguf = gguf_file.is_gguf(folder)
    try:
        info = inspect_model(folder)
        dtype = parse_dtype(options.get("dtype", "float32"))
        tokenizer_dir = gguf_file.tokenizer_folder(folder) if gguf else Path(folder)  # GGUF: from its metadata
    except (ModelImplError, ValueError) as exc:
        raise ConfigError(f"deployment {deployment_id}: {exc}") from None
    if not any((tokenizer_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ConfigError(
            f"deployment {deployment_id}: {folder} has no tokenizer (tokenizer.json / tokenizer_config.json)"
        )
    where = {"gguf_file": Path(folder).name} if gguf else {}  # transformers dequantizes the file itself
    model = transformers.AutoModelForCausalLM.from_pretrained(str(Path(folder).parent) if gguf else folder,
                                                              dtype=dtype, local_files_only=True, **where)
    model.to(torch.device(options.get("device", "cpu"))).eval()  # type: ignore[arg-type]  # transformers' stub of .to
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    eos_ids: set[int] = set()
    for eos in (model.generation_config.eos_token_id, getattr(info.hf_config, "eos_token_id", None)):
        eos_ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])  # a GGUF's end of turn too
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    # The worker sets every generation parameter itself and decides EOS per row: start from a clean
    # config so defaults in the checkpoint's generation_config.json (sampling, EOS) cannot leak in.
    model.generation_config = transformers.GenerationConfig()
    max_len = _int_option(options, "max_model_len", info.max_position_embeddings, deployment_id)
    if context_window is not None:
        max_len = min(max_len, context_window)
    log.info(
        "deployment %s: %s runs on the plain transformers generate path%s",
        deployment_id,
        info.architecture,
        f" ({reason})" if reason else "",
    )
    return HFGenerateBackend(
        deployment_id,
        folder,
        model,
        tokenizer,
        eos_ids=eos_ids,
        max_model_len=max_len,
        vocab_size=int(model.config.vocab_size),
        max_batch_rows=_int_option(options, "max_batch_size", 8, deployment_id),
        max_queue=_int_option(options, "max_queue", 64, deployment_id),
        metadata={
            "model_impl": "generate",
            "architecture": info.architecture,
            **({"model_impl_reason": reason} if reason else {}),
        },
    )


def generate_fallback(
    config: DeploymentConfig, model_impl: str, engine_options: dict[str, Any]
) -> HFGenerateBackend | None:
    """For ``provider: local``: the plain-generate backend when ``model_impl`` resolves to a model
    the engine cannot run (its attention does not go through transformers' interface), else None.

    The engine options that mean the same here are carried over (dtype, device, max_model_len,
    max_num_seqs as the batch size); ``native`` on an unsupported architecture is a ConfigError.
    """
    from engine.model_impl import ModelImplError, inspect_model, resolve_model_impl

    try:
        resolution = resolve_model_impl(inspect_model(config.model), model_impl)
    except ModelImplError as exc:
        raise ConfigError(f"deployment {config.id}: {exc}") from None
    if resolution.impl != "generate":
        return None
    options = {k: engine_options[k] for k in ("dtype", "device", "max_model_len") if engine_options.get(k) is not None}
    if engine_options.get("max_num_seqs") is not None:
        options["max_batch_size"] = engine_options["max_num_seqs"]
    return load_generate_backend(config.model, config.id, options, config.context_window, reason=resolution.reason)


def build_backend(config: DeploymentConfig) -> HFGenerateBackend:
    """Factory entry for ``provider: transformers``: always the plain generate path."""
    return load_generate_backend(
        config.model,
        config.id,
        dict(config.options),
        config.context_window,
        reason="provider 'transformers' forces the plain generate path",
    )


__all__ = ["HFGenerateBackend", "build_backend", "generate_fallback", "load_generate_backend"]
