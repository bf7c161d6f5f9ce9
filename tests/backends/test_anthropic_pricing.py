"""What an answer from an Anthropic deployment costs, from the usage Anthropic reports: prompt tokens
read from its cache, written to it (5-minute and 1-hour writes, each at its price) and plain, the
output, and each web search at the model's per-call price; streamed or not, and the usage goes back
to the client as Anthropic sent it. The anthropic SDK against a gateway on loopback and a loopback
server speaking the Messages API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import CACHE_WRITE, FakeAnthropic

PRICE = {"input_per_million": 3.0, "output_per_million": 15.0, "cached_input_per_million": 0.3,
         "cache_write_input_per_million": 3.75, "cache_write_1h_input_per_million": 6.0,
         "per_tool_call": {"web_search": 0.01}}
SEARCH: Any = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
CACHED: Any = {  # two cache breakpoints: the system prompt for five minutes, the question for an hour
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hello there", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}],
}


@pytest.fixture(scope="module")
def usage() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def ant(anthropic_upstream: FakeAnthropic, usage: RecordingSink) -> Iterator[anthropic.Anthropic]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url,
                  "api_key": "sk", "server_tools": ["web_search_20250305"]}
    with admin_gateway([{"name": "claude", "max_retries": 0, "deployments": [deployment]}],
                       {"claude": PRICE}, usage) as server:
        yield anthropic.Anthropic(base_url=server.url, api_key=ADMIN_KEY, max_retries=0)


def _cost(plain: int, read: int, written_5m: int, written_1h: int, output: int, searches: int = 0) -> float:
    return (plain * 3.0 + read * 0.3 + written_5m * 3.75 + written_1h * 6.0 + output * 15.0) / 1e6 + searches * 0.01


def test_cache_reads_and_writes_are_priced_apart(ant: anthropic.Anthropic, usage: RecordingSink) -> None:
    before = len(usage.records)
    answer = ant.messages.create(model="claude", max_tokens=16, **CACHED)
    assert (answer.usage.cache_creation_input_tokens, answer.usage.cache_read_input_tokens) == (2 * CACHE_WRITE, 2)
    assert answer.usage.cache_creation is not None
    assert answer.usage.cache_creation.ephemeral_1h_input_tokens == CACHE_WRITE  # as Anthropic sent it
    with ant.messages.stream(model="claude", max_tokens=16, **CACHED) as stream:
        streamed = stream.get_final_message()
    records = usage.wait_for(before + 2)[before:]
    for record, reported in zip(records, [answer.usage, streamed.usage], strict=True):
        plain = reported.input_tokens
        assert record.prompt_tokens == plain + 2 + 2 * CACHE_WRITE and record.cached_tokens == 2
        assert record.completion_tokens == reported.output_tokens
        assert record.cost == pytest.approx(_cost(plain, 2, CACHE_WRITE, CACHE_WRITE, reported.output_tokens))


def test_the_searches_an_answer_reports_are_priced_per_call(ant: anthropic.Anthropic, usage: RecordingSink) -> None:
    before = len(usage.records)
    messages: Any = [{"role": "user", "content": "hi"}]
    answer = ant.messages.create(model="claude", max_tokens=8, messages=messages, tools=[SEARCH])
    assert answer.usage.server_tool_use is not None and answer.usage.server_tool_use.web_search_requests == 2
    with ant.messages.stream(model="claude", max_tokens=8, messages=messages, tools=[SEARCH]) as stream:
        streamed = stream.get_final_message()
    assert streamed.usage.server_tool_use is not None and streamed.usage.server_tool_use.web_search_requests == 2
    plain = ant.messages.create(model="claude", max_tokens=8, messages=messages)  # no search: tokens only
    records = usage.wait_for(before + 3)[before:]
    expected = [_cost(u.input_tokens, 2, 0, 0, u.output_tokens, searches)
                for u, searches in [(answer.usage, 2), (streamed.usage, 2), (plain.usage, 0)]]
    assert [r.cost for r in records] == [pytest.approx(cost) for cost in expected]
