"""``/v1/messages`` streamed from the engine with prefix caching: the usage of ``message_start`` splits
the prompt as ``message_delta``'s does (``input_tokens`` without the tokens read from the cache, those
as ``cache_read_input_tokens``), so a client that takes the prompt's count from ``message_start``
(as LangChain's does) gets the same figures as one that reads the final usage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.local_gateway import KEY, Env, local_gateway

PREFIX = "A long shared prefix about railways and their many stations, bridges and tunnels. " * 8


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("messages_usage"), enable_prefix_caching=True) as served:
        yield served


def _events(env: Env, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stream's events by type (the last of each)."""
    events: dict[str, dict[str, Any]] = {}
    with httpx.stream("POST", env.server.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=60,
                      json=body | {"model": "tiny", "stream": True}) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                events[event["type"]] = event
    return events


def test_message_start_counts_a_cached_prompt_as_message_delta_does(env: Env) -> None:
    body = {"system": PREFIX, "max_tokens": 2, "messages": [{"role": "user", "content": "Tell me about trains."}]}
    _events(env, body)  # the prefix is cached from now on
    events = _events(env, body)
    start, end = events["message_start"]["message"]["usage"], events["message_delta"]["usage"]
    assert end["cache_read_input_tokens"] > 0
    assert start["input_tokens"] == end["input_tokens"]
    assert start.get("cache_read_input_tokens") == end["cache_read_input_tokens"]
    assert start["output_tokens"] == 0
    env.wait_idle()
