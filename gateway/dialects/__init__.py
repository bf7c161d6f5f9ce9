"""How answers are written back: OpenAI's shapes by default; ``gateway.dialects.anthropic`` holds
everything of Anthropic's Messages API at the gateway's edge (``POST /v1/messages``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.base import Meter
from backends.openai_wire import encode_answer
from gateway.contracts import Ticket
from gateway.quotas.headers import openai_ratelimit_headers
from gateway.streaming import OpenAIEvents, StreamEncoder


def relayed_answer(answer: Any, meter: Meter) -> bytes:
    """An upstream's answer relayed with every field it sent (its own usage: the meter is not needed)."""
    return encode_answer(answer)


@dataclass(frozen=True)
class Dialect:
    """How a whole answer (``unary``, given the call's meter: a dialect may report usage the provider
    did not, as metered) and a stream's events (``stream``, given the call's meter) are encoded, and
    the rate-limit headers of an admission (answered or refused) are named."""

    unary: Callable[[Any, Meter], bytes] = relayed_answer
    stream: Callable[[Meter], StreamEncoder] = OpenAIEvents
    ratelimit_headers: Callable[[Ticket], dict[str, str]] = openai_ratelimit_headers


OPENAI = Dialect()
