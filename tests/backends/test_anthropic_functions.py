"""OpenAI's legacy function calling (``functions``, ``function_call``) on an ``anthropic`` deployment:
sent as Anthropic's tools, tool choice, tool_use and tool_result blocks, and answered in the legacy
shape, as OpenAI answers it; an openai SDK user against a loopback server speaking the Messages API."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.support.fake_anthropic import FakeAnthropic

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
FUNCTIONS = [{"name": "search", "description": "look it up", "parameters": SCHEMA}]
ASK = [{"role": "user", "content": "tool:cats"}]  # the fake answers with a call of the first tool


def create(claude_client: openai.OpenAI, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return claude_client.chat.completions.create(model="claude", messages=messages, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("function_call", "choice"), [
    ({"name": "search"}, {"type": "tool", "name": "search", "disable_parallel_tool_use": True}),
    ("auto", {"type": "auto", "disable_parallel_tool_use": True}),
    ("none", {"type": "none"}),
])
def test_functions_and_function_call_become_tools_and_tool_choice(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic, function_call: Any, choice: Any) -> None:
    create(claude_client, [{"role": "user", "content": "hi"}], functions=FUNCTIONS, function_call=function_call)
    sent = anthropic_upstream.received[-1]
    assert sent["tools"] == [{"name": "search", "description": "look it up", "input_schema": SCHEMA}]
    assert sent["tool_choice"] == choice


def test_a_legacy_call_and_its_result_in_the_conversation_become_tool_use_and_tool_result(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic) -> None:
    create(claude_client, [{"role": "user", "content": "find cats"},
                    {"role": "assistant", "content": None,
                     "function_call": {"name": "search", "arguments": '{"q": "cats"}'}},
                    {"role": "function", "name": "search", "content": "three cats"}], functions=FUNCTIONS)
    call, result = anthropic_upstream.received[-1]["messages"][1:]
    assert call == {"role": "assistant", "content": [{"type": "tool_use", "id": "call_fn_1", "name": "search",
                                                      "input": {"q": "cats"}}]}
    assert result == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_fn_1",
                                                   "content": "three cats"}]}


def test_the_answer_takes_the_legacy_shape(claude_client: openai.OpenAI) -> None:
    reply = create(claude_client, ASK, functions=FUNCTIONS)
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call is not None and choice.message.function_call.name == "search"
    assert json.loads(choice.message.function_call.arguments) == {"q": "cats"}


def test_a_streamed_answer_takes_the_legacy_shape(claude_client: openai.OpenAI) -> None:
    chunks = list(create(claude_client, ASK, functions=FUNCTIONS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.tool_calls is None for d in deltas)
    calls = [d.function_call for d in deltas if d.function_call is not None]
    assert calls[0].name == "search"
    assert json.loads("".join(c.arguments or "" for c in calls)) == {"q": "cats"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "function_call"


def test_tools_keep_their_own_shape(claude_client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": FUNCTIONS[0]}]
    choice = create(claude_client, ASK, tools=tools).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls and choice.message.function_call is None


@pytest.mark.parametrize(("messages", "fields", "param"), [
    (ASK, {"functions": FUNCTIONS, "tools": [{"type": "function", "function": FUNCTIONS[0]}]}, "functions"),
    (ASK, {"functions": [{"description": "no name"}]}, "functions"),
    (ASK, {"functions": FUNCTIONS, "function_call": "required"}, "function_call"),
    (ASK, {"function_call": "auto"}, "function_call"),
    (ASK, {"functions": FUNCTIONS, "function_call": {"name": "other"}}, "function_call"),
    ([{"role": "user", "content": "x"}, {"role": "function", "name": "search", "content": "r"}], {}, "messages[1]"),
])
def test_what_legacy_function_calling_cannot_mean_is_a_400_naming_it(
        claude_client: openai.OpenAI, anthropic_upstream: FakeAnthropic, messages: list[dict[str, Any]],
        fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        create(claude_client, messages, **fields)
    assert refused.value.param == param and anthropic_upstream.received == []
