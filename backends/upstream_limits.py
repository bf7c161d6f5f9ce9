"""What an upstream's answer head says of its rate limits (OpenAI's, Azure's, Anthropic's headers):
how long to wait (``retry_after``, or when a used-up limit resets), whether a 429 closes it to every
request, and what is left of its tokens per minute."""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time
from collections.abc import Mapping


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date); a value that is
    no finite number ("inf", "nan") is ignored."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            if math.isfinite(wait := float(ms)):
                return max(0.0, wait / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        wait = float(value)
        return max(0.0, wait) if math.isfinite(wait) else None
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # "-0000": an HTTP date is always GMT (RFC 9110), not the host's local time
            when = when.replace(tzinfo=datetime.UTC)
        return max(0.0, when.timestamp() - time.time())


# What a rate-limited answer says is left of the upstream's limits (OpenAI's and Azure's, Anthropic's)
REMAINING = ("x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens",
              "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-tokens-remaining",
              "anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-output-tokens-remaining")


def limit_exhausted(headers: Mapping[str, str]) -> bool:
    """Whether a 429 leaves the upstream closed to every request: True unless it says what is left of
    its limits and nothing is at zero (then it refused a request as large as this one: OpenAI's
    "Request too large", or more tokens than are left just now), and True for a value not a number."""
    seen = False
    for name in REMAINING:
        if (value := headers.get(name)) is not None:
            try:
                left = float(value)
            except ValueError:
                return True
            if not left > 0:  # zero, negative or NaN
                return True
            seen = True
    return not seen


# What an answer (a 429, or any of OpenAI's, Azure's, Anthropic's) says is left of the upstream's tokens
# per minute, and when that resets
_TOKENS_LEFT = (("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
                ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"))
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")  # OpenAI's reset times: "1m30.5s", "20ms"
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_ZERO = re.compile(r"\s*0+(\.0*)?\s*")  # a limit with nothing left, as its remaining-header says it


LimitsLeft = tuple[float | None, float | None]  # (tokens left, seconds until they reset); None: not said


def tokens_left(headers: Mapping[str, str]) -> LimitsLeft:
    """The tokens an answer says are left of the upstream's tokens per minute, and the seconds until
    that limit resets (OpenAI's duration, or Anthropic's RFC 3339 time); None for what it does not say."""
    for remaining, reset in _TOKENS_LEFT:
        if (value := headers.get(remaining)) is not None:
            try:
                left = float(value)
            except ValueError:
                return None, None
            return (max(0.0, left), _reset_seconds(headers.get(reset))) if math.isfinite(left) else (None, None)
    return None, None


# What every answer of OpenAI's, Azure's and Anthropic's says is left of its requests per minute, and when that resets
_REQUESTS_LEFT = (("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
                  ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"))
_NOTHING_SAID: LimitsLeft = (None, None)


def limits_left(headers: Mapping[str, str]) -> LimitsLeft:
    """What a successful answer says is left of its upstream's limits, as ``tokens_left`` says it of
    a 429: the tokens left of its tokens per minute (0 when no request is left: until the requests
    reset), and the seconds until that resets. An answer that says nothing of them (vLLM's, SGLang's)
    costs two dict lookups."""
    if "x-ratelimit-remaining-tokens" not in headers and "anthropic-ratelimit-tokens-remaining" not in headers:
        return _NOTHING_SAID
    for remaining, reset in _REQUESTS_LEFT:
        if (value := headers.get(remaining)) is not None:
            try:
                if float(value) <= 0:
                    return 0.0, _reset_seconds(headers.get(reset))
            except ValueError:
                pass
            break
    return tokens_left(headers)


def used_up_reset(headers: Mapping[str, str]) -> float | None:
    """The seconds until the last of the limits a 429 says are at zero resets (OpenAI's, Anthropic's)."""
    resets = [r for remaining, r in (*_REQUESTS_LEFT, *_TOKENS_LEFT) if _ZERO.fullmatch(headers.get(remaining, "-"))]
    return max((w for reset in resets if (w := _reset_seconds(headers.get(reset))) is not None), default=None)


def _reset_seconds(value: str | None) -> float | None:
    if not value:
        return None
    parts = _DURATION.findall(value)
    if parts and "".join(n + unit for n, unit in parts) == value:
        return sum(float(n) * _SECONDS[unit] for n, unit in parts)
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo else None
