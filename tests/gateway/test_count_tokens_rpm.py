"""``POST /v1/messages/count_tokens`` counts against requests/min as a count of a Responses request's
input does (``Pipeline.admit_poll``): its rate-limit headers (OpenAI's and Anthropic's), then the
429 in Anthropic's shape; it reserves no tokens and is not metered."""

from __future__ import annotations

import anthropic
import pytest

from tests.gateway.tenancy_fixtures import migrated_pg_url  # noqa: F401
from tests.gateway.test_responses_polls_rpm import Gateway, gateway, native  # noqa: F401

MESSAGES = [{"role": "user", "content": "many words " * 200}]


def test_a_count_of_a_conversations_tokens_counts_against_requests_per_minute(gateway: Gateway) -> None:
    openai_client = gateway.client({"requests_per_minute": 2, "tokens_per_minute": 140})
    client = anthropic.Anthropic(base_url=gateway.url, api_key=openai_client.api_key, max_retries=0, timeout=20)
    counted = client.messages.with_raw_response.count_tokens(model="native", messages=MESSAGES)  # type: ignore[arg-type]
    assert counted.parse().input_tokens > 140  # more than tokens/min allows: a count reserves none
    headers = counted.headers
    assert (headers["anthropic-ratelimit-requests-limit"], headers["anthropic-ratelimit-requests-remaining"],
            headers["x-ratelimit-remaining-requests"], headers["x-ratelimit-remaining-tokens"]) == (
        "2", "1", "1", "140")
    client.messages.count_tokens(model="native", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.count_tokens(model="native", messages=MESSAGES)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert refused.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60


def test_an_unknown_model_is_not_counted(gateway: Gateway) -> None:
    openai_client = gateway.client({"requests_per_minute": 1})
    client = anthropic.Anthropic(base_url=gateway.url, api_key=openai_client.api_key, max_retries=0, timeout=20)
    for _ in range(2):
        with pytest.raises(anthropic.NotFoundError):
            client.messages.count_tokens(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    client.messages.count_tokens(model="native", messages=MESSAGES)  # type: ignore[arg-type]
