"""Per-request pooling parameters: an embedding request's choice of pooling (``engine.pooling``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import InvalidRequest

POOLING_TYPES = ("last", "mean")


@dataclass(frozen=True)
class PoolingParams:
    pooling: Literal["last", "mean"] = "last"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise InvalidRequest(f"pooling must be one of {', '.join(POOLING_TYPES)}", param="pooling")
