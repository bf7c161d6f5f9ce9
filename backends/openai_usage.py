"""What an OpenAI-compatible upstream's ``usage`` reports: the counts it holds, onto the meter.

A count the upstream left out, or sent as ``null`` or negative, is no count: it stays as the meter has
it (an estimate; no cached tokens) and the meter is inexact. A negative count would price the request
below zero and credit its budget; the client still gets the usage as the upstream sent it. An answer
whose usage holds a ``null`` count is decoded without it (``without_null_counts``) and relayed as it came.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from backends.base import Meter
from backends.openai_wire import Usage, relayed


class _Counts(msgspec.Struct):
    """The counts an upstream's ``usage`` holds: None for one it left out."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


_counts = msgspec.json.Decoder(_Counts)
_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_encoder = msgspec.json.Encoder()


def reported(usage: Usage, answer: Any) -> tuple[bool, bool]:
    """Whether ``answer``'s usage holds its prompt count, and its completion count (a 0 read from
    ``usage`` may be a count the upstream left out; a negative one is no count)."""
    if usage.prompt_tokens > 0 and usage.completion_tokens > 0:
        return True, True
    raw = (relayed(answer) or {}).get("usage")
    counts = _counts.decode(raw) if raw is not None else _Counts(usage.prompt_tokens, usage.completion_tokens)
    return _counted(counts.prompt_tokens), _counted(counts.completion_tokens)


def _counted(count: int | None) -> bool:
    return count is not None and count >= 0


def meter_from_usage(meter: Meter, usage: Usage, answer: Any) -> tuple[bool, bool]:
    """The counts ``answer``'s usage holds, onto the meter; a count it left out stays as the meter
    has it (an estimate), and the meter is then inexact. Which counts it held (``reported``)."""
    has_prompt, has_completion = reported(usage, answer)
    if has_prompt:
        meter.prompt_tokens = usage.prompt_tokens
    if has_completion:
        meter.completion_tokens = usage.completion_tokens
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not UNSET and details is not None else 0
    meter.cached_tokens = max(cached, 0)
    meter.exact = has_prompt and has_completion and cached >= 0
    return has_prompt, has_completion


def without_null_counts(data: bytes) -> bytes:
    """An answer's (or chunk's) JSON with the ``null`` members of its ``usage`` (and of the objects
    in it) left out, so it decodes; ``data`` itself when its usage is no object. Raises
    ``msgspec.DecodeError`` when ``data`` is no JSON object. Only for an answer that failed to decode."""
    fields = _raw_object.decode(data)
    usage = msgspec.json.decode(fields["usage"]) if "usage" in fields else None
    if not isinstance(usage, dict):
        return data
    fields["usage"] = msgspec.Raw(_encoder.encode(_non_null(usage)))
    return _encoder.encode(fields)


def _non_null(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: _non_null(v) if isinstance(v, dict) else v for k, v in obj.items() if v is not None}
