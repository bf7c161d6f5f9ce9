"""``/v1/messages`` streamed from the engine with prefix caching, as the anthropic SDK (and a raw SSE
reader that takes usage from ``message_start``, as LangChain's does) sees it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.support.local_gateway import KEY, Env, local_gateway

LONG = "trains " * 60  # several whole KV blocks: the second request reads them from the prefix cache


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("local"), enable_prefix_caching=True) as served:
        yield served


def _usages(env: Env) -> tuple[dict[str, int], dict[str, int]]:
    """``message_start``'s usage and ``message_delta``'s, of one streamed message."""
    body = {"model": "tiny", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": LONG}]}
    with httpx.stream("POST", env.server.url + "/v1/messages", json=body, headers={"x-api-key": KEY},
                      timeout=30) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    start = next(e for e in events if e["type"] == "message_start")
    delta = next(e for e in events if e["type"] == "message_delta")
    return start["message"]["usage"], delta["usage"]


def test_message_start_counts_the_prompts_cached_tokens_as_cache_reads(env: Env) -> None:
    """As Anthropic's API: ``message_start``'s ``input_tokens`` are the prompt's tokens not read from
    the cache, its cache reads apart, as ``message_delta`` and the metered record have them."""
    _usages(env)  # fills the prefix cache
    start, delta = _usages(env)
    record = env.usage.wait_for(2)[-1]
    assert record.cached_tokens > 0
    assert delta["cache_read_input_tokens"] == record.cached_tokens
    assert start["cache_read_input_tokens"] == record.cached_tokens
    assert start["input_tokens"] == delta["input_tokens"] == record.prompt_tokens - record.cached_tokens
    client = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)
    with client.messages.stream(model="tiny", max_tokens=3, messages=[{"role": "user", "content": LONG}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert final.usage.cache_read_input_tokens == record.cached_tokens
    env.wait_idle()


def test_a_ping_follows_message_start(env: Env) -> None:
    """As Anthropic's API: ``event: ping`` / ``data: {"type": "ping"}`` right after ``message_start``
    (the anthropic SDK skips it, and still reads the whole message)."""
    client = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "Hello"}]}
    with client.messages.with_streaming_response.create(**body, stream=True) as response:  # type: ignore[call-overload]
        lines = [line for line in response.iter_lines() if line]
    kinds = [line[7:] for line in lines if line.startswith("event: ")]
    assert kinds[:2] == ["message_start", "ping"] and kinds.count("ping") == 1
    at = lines.index("event: ping")
    assert json.loads(lines[at + 1].removeprefix("data: ")) == {"type": "ping"}
    assert kinds[-2:] == ["message_delta", "message_stop"]
    with client.messages.stream(**body) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3
    env.wait_idle()
