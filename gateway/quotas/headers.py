"""The rate-limit headers a client reads of its admission (``Ticket``): OpenAI's ``x-ratelimit-*``
on every endpoint (reset as a duration, "1s", "6m0s", "20ms"), and Anthropic's
``anthropic-ratelimit-*`` added on its Messages API (reset as an RFC 3339 time). Both describe the
tightest of the key's and its tenant's limits, as the admission reported them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from gateway.contracts import QuotaState, Ticket

_OPENAI = (("requests", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
           ("tokens", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"))
_ANTHROPIC = tuple((what, f"anthropic-ratelimit-{what}-limit", f"anthropic-ratelimit-{what}-remaining",
                    f"anthropic-ratelimit-{what}-reset") for what in ("requests", "tokens"))


def _states(ticket: Ticket) -> dict[str, QuotaState]:
    return {what: state for what, state in (("requests", ticket.requests), ("tokens", ticket.tokens))
            if isinstance(state, QuotaState)}


def _headers(ticket: Ticket, names: tuple[tuple[str, str, str, str], ...],
             reset: Callable[[float], str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    states = _states(ticket)
    for what, limit, remaining, resets in names:
        if (state := states.get(what)) is not None:
            headers[limit] = str(state.limit)
            headers[remaining] = str(max(0, state.remaining))
            headers[resets] = reset(max(0.0, state.reset_seconds))
    return headers


def _duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset (Go's duration): "20ms", "1s", "8.64s", "6m0s", "1h2m5.25s";
    rounded up to the millisecond, so a reset still ahead never reads as "0s"."""
    ms = math.ceil(round(seconds * 1000, 6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    return f"{hours}h{text}" if hours else text


def openai_ratelimit_headers(ticket: Ticket) -> dict[str, str]:
    return _headers(ticket, _OPENAI, _duration)


def _rfc3339(seconds: float) -> str:
    at = datetime.fromtimestamp(time.time() + seconds, tz=UTC)
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


def anthropic_ratelimit_headers(ticket: Ticket) -> dict[str, str]:
    """OpenAI's headers (clients of either read them) and Anthropic's own."""
    return openai_ratelimit_headers(ticket) | _headers(ticket, _ANTHROPIC, _rfc3339)
