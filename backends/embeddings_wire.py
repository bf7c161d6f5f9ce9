"""OpenAI's embeddings wire types (``POST /v1/embeddings``), beside ``openai_wire`` (chat and text
completions): decoded at the gateway's edge, sent as they are to HTTP providers."""

from __future__ import annotations

import base64
import struct
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from backends.openai_wire import WireStruct

# The most ``dimensions`` a client may ask for: above any model's width (today's widest are 4096 to
# 12288), so a typo or an absurd value (0, negative, 10**23) is a 400 here, never relayed upstream.
MAX_EMBEDDING_DIMENSIONS = 65536

# An empty string or token list is a 400 naming it (``input[1]``), as in a completions batch.
_Text = Annotated[str, Meta(min_length=1)]
EmbeddingInput = _Text | Annotated[list[_Text | int | Annotated[list[int], Meta(min_length=1)]], Meta(min_length=1)]


class EmbeddingRequest(WireStruct, kw_only=True, dict=True):  # dict: the client's fields kept for pass-through
    model: str
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] | None | UnsetType = UNSET  # null: not set (float), as OpenAI
    dimensions: Annotated[int, Meta(ge=1, le=MAX_EMBEDDING_DIMENSIONS)] | None | UnsetType = UNSET  # null: not set
    user: str | None | UnsetType = UNSET

    def inputs(self) -> list[str] | list[list[int]]:
        """The input as a list: strings, or token-id lists (a flat list of ids is one input).
        Raises ValueError on a mixture (the gateway answers 400 on ``input``); decoding refused an empty one."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if all(isinstance(v, str) for v in value):
            return [v for v in value if isinstance(v, str)]
        if all(isinstance(v, int) for v in value):
            return [[v for v in value if isinstance(v, int)]]
        if all(isinstance(v, list) for v in value):
            return [v for v in value if isinstance(v, list)]
        raise ValueError("input must be a string, a list of strings, a list of token ids or a list of such lists")

    @property
    def listed(self) -> bool:
        """Whether ``input`` is a list of inputs (strings or token-id lists), not one input."""
        return isinstance(self.input, list) and not all(isinstance(v, int) for v in self.input)

    @property
    def base64(self) -> bool:
        return self.encoding_format == "base64"


def encode_vector(vector: list[float], as_base64: bool) -> list[float] | str:
    """A vector as the client asked: floats, or base64 of little-endian float32 (as OpenAI sends it)."""
    if not as_base64:
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class Embedding(WireStruct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(WireStruct):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingList(WireStruct, dict=True):  # dict: an upstream's answer relayed with every field it sent
    data: list[Embedding]
    model: str
    object: str = "list"
    usage: EmbeddingUsage | None = msgspec.field(default_factory=EmbeddingUsage)  # null from some upstreams
