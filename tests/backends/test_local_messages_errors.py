"""``/v1/messages`` on the engine (the anthropic SDK as client): Anthropic's error shape has no
``param``, so an engine's 400 about the translated chat request names, in its message, the field as
the client sent it (a system prompt and tool results shift the chat request's message indices)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.local_gateway import KEY, Env, local_gateway

IMAGE: Any = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
HISTORY: Any = [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                 {"type": "text", "text": "And this?"}, IMAGE]},
]
TOOLS: Any = [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("messages")) as served:
        yield served


@pytest.fixture(scope="module")
def client(env: Env) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_block_is_named_as_sent(client: anthropic.Anthropic, stream: bool) -> None:
    """The image is in the request's messages[2] (the chat request's messages[4], after the system
    prompt and the tool result's own message)."""
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="tiny", max_tokens=4, system="Be brief.", messages=HISTORY, tools=TOOLS,
                               stream=stream)
    assert info.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages[2].content: this model accepts text content only"}}


def test_a_tool_schema_is_named_as_sent(client: anthropic.Anthropic) -> None:
    tools: Any = [{"name": "f", "input_schema": {"type": "array"}}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}], tools=tools)
    message = info.value.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("tools[0].input_schema: ") and "function" not in message


def test_count_tokens_names_a_refused_block_as_sent(env: Env) -> None:
    response = httpx.post(env.server.url + "/v1/messages/count_tokens", headers={"x-api-key": KEY},
                          json={"model": "tiny", "system": "Be brief.", "messages": HISTORY})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "messages[2].content: this model accepts text content only"


def test_a_field_named_already_is_left_as_it_is(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert info.value.body["error"]["message"] == "'thinking' is not supported by the local engine"  # type: ignore[index]


def test_a_nested_field_the_engine_cannot_honour_is_named(env: Env) -> None:
    """The engine gets the request translated to chat: a field in a message, a block or a tool that the
    translation has no place for is refused by name, as one at the top is, not dropped."""
    blocks = [{"type": "text", "text": "hi", "citations": [{"type": "char_location", "cited_text": "hi",
                                                            "document_index": 0, "start_char_index": 0,
                                                            "end_char_index": 2}]}]
    response = httpx.post(env.server.url + "/v1/messages", headers={"x-api-key": KEY},
                          json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": blocks}]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == (
        "messages[0].content[0].citations: the field 'citations' is served only by Anthropic deployments")
