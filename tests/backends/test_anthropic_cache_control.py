"""The system prompt as Anthropic's text blocks, and ``cache_control`` (Anthropic's prompt-caching
breakpoints, as clients of LiteLLM and OpenRouter put them on OpenAI content parts and tools)
carried onto the blocks and tools sent upstream: an openai SDK user against a loopback server
speaking the Messages API."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.fake_anthropic import FakeAnthropic

CACHED = {"type": "ephemeral"}
IMAGE_URL = {"url": "data:image/png;base64,AAAA"}
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}


def sent(claude_client: openai.OpenAI, upstream: FakeAnthropic, messages: list[dict[str, Any]],
         **fields: Any) -> dict[str, Any]:
    """The body the upstream received for a chat request."""
    claude_client.chat.completions.create(model="claude", messages=messages, **fields)  # type: ignore[arg-type]
    return upstream.received[-1]


def test_each_text_part_of_system_and_developer_messages_is_a_system_block_in_order(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic) -> None:
    body = sent(claude_client, anthropic_upstream, [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                       {"type": "text", "text": "Answer in French."}]},
        {"role": "developer", "content": "No lists."},
        {"role": "user", "content": "hi"}])
    assert body["system"] == [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Answer in French."},
                              {"type": "text", "text": "No lists."}]


def test_cache_control_reaches_anthropic_on_every_kind_of_block_and_on_tools(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic) -> None:
    long_ttl = {"type": "ephemeral", "ttl": "1h"}
    call = {"id": "t1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    body = sent(claude_client, anthropic_upstream, [
        {"role": "system", "content": [{"type": "text", "text": "rules", "cache_control": long_ttl},
                                       {"type": "text", "text": "more"}]},
        {"role": "user", "content": [{"type": "text", "text": "look", "cache_control": CACHED},
                                     {"type": "image_url", "image_url": IMAGE_URL, "cache_control": CACHED}]},
        {"role": "assistant", "content": [{"type": "text", "text": "checking", "cache_control": CACHED}],
         "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "found",
                                                            "cache_control": CACHED}]},
        {"role": "user", "content": "thanks"}], tools=[TOOL | {"cache_control": CACHED}])
    assert body["system"] == [{"type": "text", "text": "rules", "cache_control": long_ttl},
                              {"type": "text", "text": "more"}]
    user, assistant, result = body["messages"][0], body["messages"][1], body["messages"][2]
    assert [b.get("cache_control") for b in user["content"]] == [CACHED, CACHED]
    assert assistant["content"][0] == {"type": "text", "text": "checking", "cache_control": CACHED}
    assert result["content"][0]["content"] == [{"type": "text", "text": "found", "cache_control": CACHED}]
    assert body["tools"][0]["cache_control"] == CACHED


def test_a_part_without_cache_control_sends_none(claude_client: openai.OpenAI,
                                                 anthropic_upstream: FakeAnthropic) -> None:
    body = sent(claude_client, anthropic_upstream, [{"role": "user", "content": [
        {"type": "text", "text": "plain", "cache_control": None}]}], tools=[TOOL])
    assert body["messages"][0]["content"] == [{"type": "text", "text": "plain"}]
    assert "cache_control" not in body["tools"][0]


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "user", "content": [{"type": "text", "text": "x", "cache_control": "ephemeral"}]},
     "messages[0].content[0].cache_control"),
    ({"role": "system", "content": [{"type": "text", "text": "x", "cache_control": True}]},
     "messages[0].content[0].cache_control"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": IMAGE_URL, "cache_control": ["ephemeral"]}]},
     "messages[0].content[0].cache_control"),
])
def test_a_cache_control_that_is_not_an_object_is_a_400_naming_it(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic, message: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        claude_client.chat.completions.create(model="claude", messages=[message])  # type: ignore[list-item]
    assert refused.value.param == param and anthropic_upstream.received == []


def test_a_tools_cache_control_that_is_not_an_object_is_a_400_naming_it(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        claude_client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}],
                                       tools=[TOOL | {"cache_control": 1}])  # type: ignore[list-item]
    assert refused.value.param == "tools[0].cache_control" and anthropic_upstream.received == []
