"""Native model architectures, keyed by the Hugging Face ``architectures`` name in config.json."""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.models.llama import LlamaForCausalLM
from engine.models.mistral import MistralForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def resolve_architecture(hf_config: Any) -> type[nn.Module] | None:
    """The native class for a config's first supported architecture, or None."""
    for name in getattr(hf_config, "architectures", None) or []:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    return None


__all__ = ["MODEL_REGISTRY", "resolve_architecture"]
