"""Transformers fallback for architectures the engine does not implement natively.

``resolve`` decides (model_impl auto | native | transformers), ``hf_model`` runs transformers
modules inside the engine with our paged attention, ``load`` loads what was decided.
"""

from engine.fallback.load import LoadedModel, load_engine_model, load_transformers_model
from engine.fallback.resolve import (
    MODEL_IMPLS,
    ModelImplError,
    ModelInfo,
    Resolution,
    inspect_model,
    native_architectures,
    resolve_model_impl,
)

__all__ = [
    "MODEL_IMPLS",
    "LoadedModel",
    "ModelImplError",
    "ModelInfo",
    "Resolution",
    "inspect_model",
    "load_engine_model",
    "load_transformers_model",
    "native_architectures",
    "resolve_model_impl",
]
