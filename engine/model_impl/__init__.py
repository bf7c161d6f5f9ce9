"""Which implementation runs a model, and loading it: native (``engine/models``) or, for
architectures the engine does not implement natively, the transformers modules inside the engine.

``resolve`` decides (model_impl auto | native | transformers), ``hf_model`` runs transformers
modules inside the engine with our paged attention, ``load`` loads what was decided. (Models
that cannot take our attention are served by plain ``generate``: ``backends.transformers_generate``.)
"""

from engine.model_impl.load import LoadedModel, load_engine_model, load_transformers_model
from engine.model_impl.resolve import (
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
