"""The ``x-ratelimit-reset-*`` headers in OpenAI's own format (Go's duration: "1s", "6m0s", "20ms",
"1m30.5s"), so a client that parses OpenAI's parses the gateway's."""

from __future__ import annotations

import pytest

from gateway.contracts import Principal, QuotaState, Ticket
from gateway.quotas.headers import anthropic_ratelimit_headers, openai_ratelimit_headers


def _reset(seconds: float) -> str:
    ticket = Ticket(Principal(key_id="k", tenant_id="t"), "m", 0, requests=QuotaState(5, 4, seconds))
    return openai_ratelimit_headers(ticket)["x-ratelimit-reset-requests"]


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.0, "0s"), (0.02, "20ms"), (0.0004, "1ms"), (0.9995, "1s"), (1.0, "1s"), (8.64, "8.64s"), (59.874, "59.874s"),
    (60.0, "1m0s"), (90.5, "1m30.5s"), (360.0, "6m0s"), (3725.25, "1h2m5.25s"),
])
def test_resets_are_openais_durations(seconds: float, shown: str) -> None:
    assert _reset(seconds) == shown


def test_the_messages_api_gets_the_same_duration_beside_anthropics_time() -> None:
    ticket = Ticket(Principal(key_id="k", tenant_id="t"), "m", 0, tokens=QuotaState(100, 50, 1.5))
    headers = anthropic_ratelimit_headers(ticket)
    assert headers["x-ratelimit-reset-tokens"] == "1.5s" and headers["anthropic-ratelimit-tokens-reset"].endswith("Z")
