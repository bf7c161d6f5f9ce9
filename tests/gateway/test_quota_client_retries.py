"""What the official SDKs do with the gateway's quota refusals: a spent budget is OpenAI's
``insufficient_quota`` and no SDK retries it (the Anthropic SDK would otherwise sleep out a
Retry-After of hours), and /v1/messages carries Anthropic's own ``anthropic-ratelimit-*`` headers.
The real app on PostgreSQL and Redis, the SDKs on loopback."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.tenancy_fixtures import REDIS_URL, migrated_pg_url  # noqa: F401
from tests.gateway.test_quota_headers import Gateway, chat, gateway  # noqa: F401
from tests.support.fake_upstream import FakeUpstream

HI = [{"role": "user", "content": "hi"}]


def counting(sent: list[str], http: Any = httpx) -> Any:
    """A client of ``http`` (httpx, or the httpx2 the Anthropic SDK takes) noting each request's path."""
    return http.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]}, timeout=20)


def spend(gateway: Gateway, upstream: FakeUpstream, limits: dict[str, Any]) -> dict[str, Any]:
    _, key = gateway.tenant_key(limits)
    upstream.options.output_words = 400
    assert chat(gateway.client(key), max_tokens=400).parse().usage.total_tokens > 400
    return key


def within(seconds: float, fn: Any) -> Any:
    """``fn()``'s exception (or None), failing the test when it takes over ``seconds``."""
    caught: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            caught.append(None)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert caught, f"still waiting after {seconds} s (an SDK sleeping out a Retry-After)"
    return caught[0]


@pytest.mark.parametrize("limits", [
    {"token_budget": 1000, "budget_period": "day"},
    {"cost_budget": 0.01, "budget_period": "month"},  # 1000 tokens at 10 USD/M
    {"token_budget": 1000, "budget_period": "total"},
])
def test_a_spent_budget_is_insufficient_quota_and_the_openai_sdk_does_not_retry_it(
        gateway: Gateway, upstream: FakeUpstream, limits: dict[str, Any]) -> None:
    key = spend(gateway, upstream, limits)
    sent: list[str] = []
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key["key"], http_client=counting(sent))
    refused = within(15, lambda: chat(client, max_tokens=700))
    assert isinstance(refused, openai.RateLimitError), refused
    assert refused.code == "insufficient_quota" and refused.type == "insufficient_quota"
    assert refused.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/chat/completions"]  # the default two retries would be refused the same


def test_a_spent_budget_does_not_put_the_anthropic_sdk_to_sleep(gateway: Gateway, upstream: FakeUpstream) -> None:
    """The Anthropic SDK sleeps out any Retry-After, however long: a day's budget must say not to retry."""
    import anthropic
    import httpx2

    key = spend(gateway, upstream, {"token_budget": 1000, "budget_period": "day"})
    sent: list[str] = []
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key["key"], http_client=counting(sent, httpx2))
    refused = within(15, lambda: client.messages.create(model="echo", max_tokens=700, messages=HI))
    assert isinstance(refused, anthropic.RateLimitError), refused
    assert refused.response.headers["x-should-retry"] == "false" and sent == ["/v1/messages"]


def test_rate_limits_are_still_retried(gateway: Gateway, upstream: FakeUpstream) -> None:
    """A concurrency refusal asks for a second's wait, and the SDK takes it (no x-should-retry)."""
    _, key = gateway.tenant_key({"max_concurrency": 1})
    upstream.options.latency = 1.0
    slow = threading.Thread(target=lambda: chat(gateway.client(key), max_tokens=2))
    slow.start()
    time.sleep(0.4)
    sent: list[str] = []
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key["key"], http_client=counting(sent))
    done = chat(client, max_tokens=2)
    slow.join()
    assert done.http_response.status_code == 200 and len(sent) == 2


def anthropic_reset(value: str) -> float:
    """Seconds from now to an ``anthropic-ratelimit-*-reset`` (RFC 3339)."""
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert at.tzinfo is not None and value.endswith("Z"), value
    return (at - datetime.now(UTC)).total_seconds()


def test_messages_carry_anthropics_rate_limit_headers(gateway: Gateway, upstream: FakeUpstream) -> None:
    import anthropic

    _, key = gateway.tenant_key({"requests_per_minute": 2, "tokens_per_minute": 10_000})
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key["key"], max_retries=0, timeout=20)
    h = client.messages.with_raw_response.create(model="echo", max_tokens=10, messages=HI).headers
    assert (h["anthropic-ratelimit-requests-limit"], h["anthropic-ratelimit-requests-remaining"]) == ("2", "1")
    assert h["anthropic-ratelimit-tokens-limit"] == "10000"
    assert 0 < int(h["anthropic-ratelimit-tokens-remaining"]) < 10_000
    for name in ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset"):
        assert -1 < anthropic_reset(h[name]) <= 61
    with client.messages.with_streaming_response.create(model="echo", max_tokens=10, messages=HI,
                                                        stream=True) as streamed:
        assert streamed.headers["anthropic-ratelimit-requests-remaining"] == "0"
        list(streamed.iter_lines())
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model="echo", max_tokens=10, messages=HI)
    h = refused.value.response.headers
    assert h["anthropic-ratelimit-requests-remaining"] == "0" and int(h["retry-after"]) >= 1
    assert 0 < anthropic_reset(h["anthropic-ratelimit-requests-reset"]) <= 61


def test_openai_endpoints_carry_no_anthropic_headers(gateway: Gateway, upstream: FakeUpstream) -> None:
    _, key = gateway.tenant_key({"requests_per_minute": 5})
    h = chat(gateway.client(key), max_tokens=2).headers
    assert h["x-ratelimit-limit-requests"] == "5" and not any(n.startswith("anthropic-") for n in h)
