"""Tool choices on the anthropic provider as an openai SDK user meets them: ``allowed_tools`` (chat's,
and the Responses API's through its chat translation) sends only the tools it allows, in its mode;
a malformed choice is a 400 naming it, never a 500 or a misleading message."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from tests.backends.claude_gateway import client, gateway_url, upstream  # noqa: F401  (fixtures)
from tests.support.fake_anthropic import ScriptedAnthropic


def _function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


TOOLS: Any = [_function("search"), _function("get_time"), _function("delete_all")]


def _allowed(mode: str, *names: str) -> Any:
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}


@pytest.mark.parametrize(("mode", "sent"), [("auto", "auto"), ("required", "any")])
def test_allowed_tools_sends_only_the_tools_it_allows(client: openai.OpenAI, upstream: ScriptedAnthropic,
                                                      mode: str, sent: str) -> None:
    reply = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "tool:x"}],
                                           tools=TOOLS, tool_choice=_allowed(mode, "get_time", "search"))
    body = upstream.received[-1]
    assert [t["name"] for t in body["tools"]] == ["search", "get_time"]  # the request's order
    assert body["tool_choice"] == {"type": sent}
    calls = reply.choices[0].message.tool_calls or []
    assert calls and isinstance(call := calls[0], ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "search" and reply.choices[0].finish_reason == "tool_calls"


def test_allowed_tools_without_parallel_calls(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                   tool_choice=_allowed("required", "get_time"), parallel_tool_calls=False)
    body = upstream.received[-1]
    assert [t["name"] for t in body["tools"]] == ["get_time"]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}


def test_the_responses_apis_allowed_tools_reach_anthropic(client: openai.OpenAI,
                                                         upstream: ScriptedAnthropic) -> None:
    tools: Any = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("search", "get_time")]
    client.responses.create(model="claude", input="x", tools=tools, tool_choice={
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]})
    body = upstream.received[-1]
    assert [t["name"] for t in body["tools"]] == ["get_time"] and body["tool_choice"] == {"type": "any"}


@pytest.mark.parametrize(("choice", "param"), [
    (_allowed("auto", "nope"), "tool_choice.allowed_tools.tools[0]"),
    (_allowed("sometimes", "search"), "tool_choice.allowed_tools"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "tool_choice.allowed_tools"),
    ({"type": "function", "function": "search"}, "tool_choice"),
    ({"type": "function"}, "tool_choice"),
])
def test_a_malformed_tool_choice_is_a_400_naming_it(client: openai.OpenAI, upstream: ScriptedAnthropic,
                                                    choice: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                       tool_choice=choice)
    assert refused.value.param == param and upstream.received == []


def test_a_named_function_not_among_the_tools_is_a_400_naming_tool_choice(client: openai.OpenAI,
                                                                          upstream: ScriptedAnthropic) -> None:
    """As the built-in engine answers it, not sent for the upstream to refuse in its own words."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert refused.value.param == "tool_choice" and "nope" in refused.value.message and upstream.received == []
