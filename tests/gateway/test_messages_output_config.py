"""``POST /v1/messages`` fields of today's anthropic SDK that chat can carry, translated for an OpenAI
upstream rather than refused: ``output_config`` (``messages.parse``'s structured output, and
``effort``), the top-level ``cache_control`` (automatic prompt caching, a hint chat has no field
for, as the blocks' own ``cache_control``) and ``thinking`` disabled (which asks for nothing)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import msgspec
import pytest
from pydantic import BaseModel

from gateway.dialects.anthropic_params import messages_param
from gateway.dialects.anthropic_request import MessagesRequest, as_sent
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, chat_answer

QUESTION: list[Any] = [{"role": "user", "content": "q"}]


class Answer(BaseModel):
    a: int


@pytest.fixture
def client(env: GatewayEnv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.server.url, api_key=ADMIN_KEY, max_retries=0)


def test_structured_output_is_a_strict_json_schema_and_effort_reasoning_effort(
    client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    upstream.fail_next(chat_answer({"role": "assistant", "content": '{"a": 1}'}, "stop"))
    message = client.messages.parse(
        model="echo", max_tokens=16, messages=QUESTION, output_format=Answer, output_config={"effort": "low"}
    )
    assert message.parsed_output == Answer(a=1)
    sent = upstream.last.json
    assert sent["response_format"]["type"] == "json_schema"
    spec = sent["response_format"]["json_schema"]
    assert spec["strict"] is True and spec["schema"]["properties"] == {"a": {"type": "integer", "title": "A"}}
    assert sent["reasoning_effort"] == "low" and "output_config" not in sent


def test_the_top_level_cache_control_asks_a_chat_upstream_nothing(
    client: anthropic.Anthropic, upstream: FakeUpstream
) -> None:
    client.messages.create(model="echo", max_tokens=16, messages=QUESTION, cache_control={"type": "ephemeral"})
    assert "cache_control" not in upstream.last.json


def test_thinking_disabled_asks_a_chat_upstream_nothing(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """Sent on, it would be refused by OpenAI and the engine, which know no ``thinking``."""
    client.messages.create(model="echo", max_tokens=16, messages=QUESTION, thinking={"type": "disabled"})
    assert "thinking" not in upstream.last.json


@pytest.mark.parametrize(
    ("output_config", "param"),
    [
        ({"format": {"type": "json_schema"}}, "output_config.format.schema"),
        ({"format": {"type": "regex", "schema": {}}}, "output_config.format.type"),
        ({"verbosity": "low"}, "output_config.verbosity"),
    ],
)
def test_what_chat_cannot_carry_of_output_config_is_a_400_naming_it(
    env: GatewayEnv, upstream: FakeUpstream, output_config: dict[str, Any], param: str
) -> None:
    answer = httpx.post(
        env.server.url + "/v1/messages",
        headers={"x-api-key": ADMIN_KEY},
        timeout=10,
        json={"model": "echo", "max_tokens": 8, "messages": QUESTION, "output_config": output_config},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(param)
    assert upstream.received == []


@pytest.mark.parametrize(
    ("chat", "messages"),
    [
        ("response_format.json_schema.schema.properties", "output_config.format.schema.properties"),
        ("response_format", "output_config.format"),
        ("reasoning_effort", "output_config.effort"),
    ],
)
def test_an_error_about_them_names_them_as_the_client_sent_them(chat: str, messages: str) -> None:
    assert messages_param(chat, ["messages[0]"]) == messages


def test_an_anthropic_deployment_gets_output_config_as_sent_not_as_a_json_answer() -> None:
    """Its answer is the upstream's own (no forced tool to read as the JSON answer, as a chat
    request's ``response_format`` is served on an ``anthropic`` deployment)."""
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": QUESTION,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"},
    }
    chat = as_sent(msgspec.convert(body, MessagesRequest), {})
    assert chat.response_format is msgspec.UNSET
