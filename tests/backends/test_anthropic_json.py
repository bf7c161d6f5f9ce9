"""A JSON ``response_format`` on an ``anthropic`` deployment: sent as one forced tool whose input
schema is the requested one, and answered as OpenAI answers it, the JSON as the message's content
(finish reason ``stop``, no tool calls), streamed too; an openai SDK user against a loopback server
speaking the Messages API."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.support.fake_anthropic import FakeAnthropic

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ADA = {"name": "Ada", "age": 36}
ASK = [{"role": "user", "content": "json:" + json.dumps(ADA)}]  # the fake's forced call has this input
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
OBJECT_FORMAT = {"type": "json_object"}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def create(claude_client: openai.OpenAI, **fields: Any) -> Any:
    fields.setdefault("messages", ASK)
    return claude_client.chat.completions.create(model="claude", **fields)


@pytest.mark.parametrize(("response_format", "tool"), [
    (SCHEMA_FORMAT, {"name": "person", "description": "Answer with person as JSON.", "input_schema": PERSON,
                     "strict": True}),
    (OBJECT_FORMAT, {"name": "json_object", "description": "Answer with a JSON object.",
                     "input_schema": {"type": "object"}}),
])
def test_a_json_response_format_is_one_forced_tool(claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic,
                                                   response_format: dict[str, Any], tool: dict[str, Any]) -> None:
    create(claude_client, response_format=response_format)
    sent = anthropic_upstream.received[-1]
    assert sent["tools"] == [tool] and sent["tool_choice"] == {"type": "tool", "name": tool["name"]}
    assert "response_format" not in sent


def test_a_json_schema_without_strict_sends_a_tool_without_strict(claude_client: openai.OpenAI,
                                                                  anthropic_upstream: FakeAnthropic) -> None:
    create(claude_client, response_format={"type": "json_schema", "json_schema": {
        "name": "person", "description": "a person", "schema": PERSON}})
    assert anthropic_upstream.received[-1]["tools"] == [{"name": "person", "description": "a person",
                                                         "input_schema": PERSON}]


@pytest.mark.parametrize("response_format", [SCHEMA_FORMAT, OBJECT_FORMAT])
def test_the_answer_is_the_json_as_content(claude_client: openai.OpenAI, response_format: dict[str, Any]) -> None:
    choice = create(claude_client, response_format=response_format).choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert json.loads(choice.message.content) == ADA


@pytest.mark.parametrize("response_format", [SCHEMA_FORMAT, OBJECT_FORMAT])
def test_a_streamed_answer_is_the_json_as_content_deltas(claude_client: openai.OpenAI,
                                                         anthropic_upstream: FakeAnthropic,
                                                         response_format: dict[str, Any]) -> None:
    chunks = list(create(claude_client, response_format=response_format, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.tool_calls is None for d in deltas)
    pieces = [d.content for d in deltas if d.content]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == ADA  # the fake sends the input in two pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert anthropic_upstream.received[-1]["tool_choice"]["type"] == "tool"


@pytest.mark.parametrize("fields", [
    {"tools": TOOLS},
    {"functions": [{"name": "search", "parameters": {"type": "object"}}]},
    {"reasoning_effort": "low", "max_tokens": 4000},
    {"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 1024}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "list", "schema": {"type": "array"}}}},
])
def test_what_a_forced_tool_cannot_answer_faithfully_is_a_400_naming_response_format(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic, fields: dict[str, Any]) -> None:
    """Tools beside it (the answer could be their call or the JSON), extended thinking (Anthropic forces
    no tool with it), a schema whose root is no object (a tool's input is one): refused, never guessed."""
    with pytest.raises(openai.BadRequestError) as refused:
        create(claude_client, **({"response_format": OBJECT_FORMAT} | fields))
    assert refused.value.param == "response_format" and anthropic_upstream.received == []


def test_vllms_structural_tag_is_a_400_naming_the_type(claude_client: openai.OpenAI,
                                                        anthropic_upstream: FakeAnthropic) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        create(claude_client, response_format={"type": "structural_tag", "format": {"type": "triggered_tags"}})
    assert refused.value.param == "response_format.type" and anthropic_upstream.received == []


def test_tools_without_a_json_response_format_keep_their_calls(claude_client: openai.OpenAI) -> None:
    choice = create(claude_client, messages=[{"role": "user", "content": "tool:x"}], tools=TOOLS,
                    response_format={"type": "text"}).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
