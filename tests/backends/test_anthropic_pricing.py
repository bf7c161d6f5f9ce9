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

from backends.dev.echo_server import Exchange
from tests.backends.conftest import admin_gateway, sse_events
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import CACHE_WRITE, FakeAnthropic, _text, send_events

PRICE = {"input_per_million": 3.0, "output_per_million": 15.0, "cached_input_per_million": 0.3,
         "cache_write_input_per_million": 3.75, "cache_write_1h_input_per_million": 6.0,
         "per_tool_call": {"web_search": 0.01}}
SEARCH: Any = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
CACHED: Any = {  # two cache breakpoints: the system prompt for five minutes, the question for an hour
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hello there", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}],
}


# streamed questions the upstream below answers with its searches' blocks: cut short, whole, whole
# with every search failed (the usage reports none: Anthropic bills no failed search)
CUT, WHOLE, FAILED = "CUT", "WHOLE", "FAILED"


class SearchingAnthropic(FakeAnthropic):
    """Streams for ``CUT`` and ``WHOLE`` a message_start (2 tokens read from the cache, CACHE_WRITE
    written) and, with a web search tool, its searches' blocks (server_tool_use, web_search_tool_result);
    then for ``CUT`` nothing (cut short: no message_delta, no message_stop), for ``WHOLE`` the usage
    reporting the searches and message_stop."""

    async def _stream(self, ex: Exchange, payload: dict[str, Any], blocks: list[dict[str, Any]], stop: str,
                      usage: dict[str, Any], matched: str | None = None) -> None:
        text = _text(payload["messages"][-1]["content"])
        if not text.startswith((CUT, WHOLE, FAILED)):
            return await super()._stream(ex, payload, blocks, stop, usage, matched)
        start = {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 2,
                 "cache_creation_input_tokens": CACHE_WRITE,
                 "cache_creation": {"ephemeral_5m_input_tokens": CACHE_WRITE}}
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": {
            "id": "msg_s", "type": "message", "role": "assistant", "model": payload["model"], "content": [],
            "usage": start}})]
        for i in range(searches := usage.get("server_tool_use", {}).get("web_search_requests", 0)):
            events += [
                ("content_block_start", {"index": 2 * i, "content_block": {
                    "type": "server_tool_use", "id": f"srvtoolu_{i}", "name": "web_search", "input": {}}}),
                ("content_block_delta", {"index": 2 * i, "delta": {"type": "input_json_delta",
                                                                   "partial_json": '{"query": "q"}'}}),
                ("content_block_stop", {"index": 2 * i}),
                ("content_block_start", {"index": 2 * i + 1, "content_block": {
                    "type": "web_search_tool_result", "tool_use_id": f"srvtoolu_{i}", "content": [
                        {"type": "web_search_result", "url": "https://x", "title": "x", "encrypted_content": "e"}]}}),
                ("content_block_stop", {"index": 2 * i + 1}),
            ]
        if not text.startswith(CUT):
            billed = searches if text.startswith(WHOLE) else 0
            events += [("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {
                "output_tokens": 3, "server_tool_use": {"web_search_requests": billed}}}), ("message_stop", {})]
        await send_events(ex, events)


@pytest.fixture(scope="module")
def anthropic_upstream() -> Iterator[SearchingAnthropic]:
    server = SearchingAnthropic().start()
    yield server
    server.stop()


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


def _streamed(ant: anthropic.Anthropic, usage: RecordingSink, text: str, **body: Any) -> Any:
    """The usage record of a /v1/messages stream for ``text`` (CUT: cut short, failed)."""
    before = len(usage.records)
    body = {"model": "claude", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": text}]} | body
    events = sse_events(f"{ant.base_url}".rstrip("/") + "/v1/messages", body, {"x-api-key": ADMIN_KEY})
    record = usage.wait_for(before + 1)[before]
    ended, outcome = ("error", "failed") if text == CUT else ("message_stop", "completed")  # FAILED completes
    assert (events[-1][0], record.extra) == (ended, {"outcome": outcome})
    return record


def test_a_stream_cut_short_prices_its_cache_reads_at_the_cached_price(ant: anthropic.Anthropic,
                                                                      usage: RecordingSink) -> None:
    """message_start reported the cache reads: they are not priced as plain input when no message_stop follows."""
    record = _streamed(ant, usage, CUT)
    assert record.prompt_tokens == 5 + 2 + CACHE_WRITE and record.cached_tokens == 2
    assert record.cost == pytest.approx(_cost(5, 2, CACHE_WRITE, 0, record.completion_tokens))


@pytest.mark.parametrize(("text", "billed"), [(CUT, 2), (WHOLE, 2), (FAILED, 0)])
def test_the_searches_a_stream_made_are_priced_once_cut_short_or_not(ant: anthropic.Anthropic, usage: RecordingSink,
                                                                    text: str, billed: int) -> None:
    """The searches made before a cut (server_tool_use blocks) are priced though no usage reported
    them; a whole stream's usage reports those billed, which replace the blocks counted: priced
    once, not twice, and not at all when the usage says none was billed."""
    record = _streamed(ant, usage, text, tools=[SEARCH])
    assert record.cost == pytest.approx(_cost(5, 2, CACHE_WRITE, 0, record.completion_tokens, searches=billed))
