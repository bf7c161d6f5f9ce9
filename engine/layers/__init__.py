"""Building blocks of the native models: norms, rotary embeddings, linear helpers, MLP, paged attention."""

from engine.layers.activation import GatedMLP, SiluAndMul
from engine.layers.attention import PagedAttention
from engine.layers.linear import MergedLinear
from engine.layers.rmsnorm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, get_rope

__all__ = [
    "GatedMLP",
    "MergedLinear",
    "PagedAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "SiluAndMul",
    "get_rope",
]
