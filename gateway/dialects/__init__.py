"""How answers are written back: OpenAI's shapes by default; ``gateway.dialects.anthropic`` holds
everything of Anthropic's Messages API at the gateway's edge (``POST /v1/messages``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.streaming import OpenAIEvents, StreamEncoder

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class Dialect:
    """How a whole answer (``unary``) and a stream's events (``stream``) are encoded."""

    unary: Callable[[Any], bytes] = _encoder.encode
    stream: Callable[[], StreamEncoder] = OpenAIEvents


OPENAI = Dialect()
