"""Which implementation runs a model folder: ``model_impl`` = auto | native | transformers.

- ``native``: one of our models in ``engine/models`` (``MODEL_REGISTRY``).
- ``transformers``: the transformers modules inside our engine, attention replaced by our paged
  attention through transformers' ``AttentionInterface`` (scheduler, paged KV cache, prefix
  caching and sampler are ours).
- ``generate``: plain ``model.generate`` (the ``transformers`` provider of ``backends/``), for
  models whose attention does not go through that interface.

``auto`` picks native when ``config.architectures`` names a native one, else transformers when
the model can take our attention, else generate. ``native`` on an unsupported architecture is an
error listing the native ones; ``transformers`` on a model that cannot take our attention falls
to generate, with the reason.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

MODEL_IMPLS = ("auto", "native", "transformers")
Impl = Literal["native", "transformers", "generate"]


class ModelImplError(ValueError):
    """An impossible ``model_impl`` request, or a folder transformers cannot load as a causal LM."""


@dataclass(frozen=True)
class ModelInfo:
    """What the resolution needs to know about a model folder."""

    folder: str
    architecture: str
    hf_config: Any
    max_position_embeddings: int
    native: bool

    @functools.cached_property
    def in_engine_blocker(self) -> str | None:
        """Why the transformers-in-engine path cannot take it (None: it can). Asked only when a
        native model is not chosen: it imports transformers' modeling code (about 150 MB)."""
        return _in_engine_blocker(self.hf_config)


@dataclass(frozen=True)
class Resolution:
    impl: Impl
    architecture: str
    reason: str

    def describe(self) -> str:
        return f"{self.architecture}: model_impl={self.impl} ({self.reason})"


def native_architectures() -> list[str]:
    from engine.models import MODEL_REGISTRY

    return sorted(MODEL_REGISTRY)


def _in_engine_blocker(hf_config: Any) -> str | None:
    import transformers

    mapping = transformers.AutoModelForCausalLM._model_mapping
    config_cls: Any = type(hf_config)
    if config_cls not in mapping:  # a config class of our own (a GGUF Llama's): transformers' by its model_type
        try:
            config_cls = type(transformers.AutoConfig.for_model(getattr(hf_config, "model_type", "")))
        except ValueError:
            return "transformers has no causal-LM class for it"
    try:
        cls: Any = mapping[config_cls]
    except KeyError:
        return "transformers has no causal-LM class for it"
    if not getattr(cls, "_supports_attention_backend", False):
        return f"{cls.__name__} does not route attention through transformers' AttentionInterface"
    from engine.model_impl.hf_model import unsupported_attention_kwargs

    if extras := unsupported_attention_kwargs(cls):
        sinks = " (attention sinks)" if {"s_aux", "sinks"} & set(extras) else ""
        return (f"{cls.__name__}'s attention takes {', '.join(extras)}{sinks}, which the paged attention "
                "does not implement")
    if getattr(hf_config, "attn_logit_softcapping", None):
        return "attention logit soft-capping is not supported by the paged attention"
    if getattr(hf_config, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported"
    return None


def inspect_model(folder: str | Path) -> ModelInfo:
    """Read config.json of a local HF folder (no weights) and classify its architecture."""
    import transformers

    from engine import gguf_file

    path = Path(folder)
    if gguf_file.is_gguf(path):
        try:
            hf_config = gguf_file.load_config(path)
        except gguf_file.GGUFError as exc:
            raise ModelImplError(str(exc)) from None
    elif not (path / "config.json").is_file():
        raise ModelImplError(f"model folder {str(path)!r} does not exist or has no config.json")
    else:
        try:
            hf_config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (ValueError, KeyError, OSError) as exc:
            raise ModelImplError(f"transformers cannot read {path / 'config.json'}: {exc}") from None
    names = list(getattr(hf_config, "architectures", None) or [])
    native = set(native_architectures())
    arch = next((n for n in names if n in native), names[0] if names else type(hf_config).__name__)
    if getattr(hf_config, "is_encoder_decoder", False):
        raise ModelImplError(f"{arch} is an encoder-decoder model; only decoder-only causal LMs are served")
    return ModelInfo(
        folder=str(path),
        architecture=arch,
        hf_config=hf_config,
        max_position_embeddings=int(getattr(hf_config, "max_position_embeddings", None) or 2048),
        native=arch in native,
    )


def resolve_model_impl(info: ModelInfo, requested: str = "auto") -> Resolution:
    """Apply the rules above; raise ModelImplError for ``native`` on an unsupported architecture."""
    if requested not in MODEL_IMPLS:
        raise ModelImplError(f"model_impl must be one of {list(MODEL_IMPLS)}, got {requested!r}")
    arch = info.architecture
    if requested == "native" or (requested == "auto" and info.native):
        if not info.native:
            raise ModelImplError(
                f"model_impl=native: architecture {arch} has no native implementation; natively supported: "
                f"{', '.join(native_architectures())}. Use model_impl=auto or transformers to run it via transformers."
            )
        return Resolution("native", arch, "native implementation" + (" requested" if requested == "native" else ""))
    if info.in_engine_blocker is None:
        why = "requested" if requested == "transformers" else "no native implementation"
        return Resolution("transformers", arch, f"{why}; transformers modules with the engine's paged attention")
    return Resolution("generate", arch, f"{info.in_engine_blocker}; plain transformers generate")
