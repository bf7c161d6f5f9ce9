"""How answers are written back: OpenAI's shapes by default; ``gateway.dialects.anthropic`` holds
everything of Anthropic's Messages API at the gateway's edge (``POST /v1/messages``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.base import Meter
from backends.openai_wire import encode_answer
from gateway.streaming import OpenAIEvents, StreamEncoder


@dataclass(frozen=True)
class Dialect:
    """How a whole answer (``unary``) and a stream's events (``stream``) are encoded."""

    unary: Callable[[Any], bytes] = encode_answer  # an upstream's answer relayed with every field it sent
    stream: Callable[[Meter], StreamEncoder] = OpenAIEvents  # given the call's meter


OPENAI = Dialect()
