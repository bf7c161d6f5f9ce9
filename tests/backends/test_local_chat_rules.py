"""Conversations OpenAI refuses are refused by the built-in engine too, with a 400 naming the
message's field (the official SDK as client): each was a 200 with the chat template rendering
an empty turn or an unattributed tool result in the prompt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.local_gateway import Env, local_gateway

CALL: Any = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
ASKED: Any = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None,
                                                                  "tool_calls": [CALL]}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("chat_rules")) as served:
        yield served


REFUSED: Any = {
    "tool message without tool_call_id": ([*ASKED, {"role": "tool", "content": "sunny"}], "messages[2].tool_call_id"),
    "tool_call_id answering no call": ([*ASKED, {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}],
                                       "messages[2].tool_call_id"),
    "tool message before any call": ([{"role": "user", "content": "hi"},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
                                     "messages[1].tool_call_id"),
    "tool message with null content": ([*ASKED, {"role": "tool", "tool_call_id": "call_1", "content": None}],
                                       "messages[2].content"),
    "user message with null content": ([{"role": "user", "content": None}], "messages[0].content"),
    "user message without content": ([{"role": "user"}], "messages[0].content"),
    "user message with no parts": ([{"role": "user", "content": []}], "messages[0].content"),
    "system message with null content": ([{"role": "system", "content": None}, {"role": "user", "content": "hi"}],
                                         "messages[0].content"),
    "assistant message with neither content nor tool_calls": (
        [{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "user", "content": "and?"}],
        "messages[1].content"),
    "assistant message with an empty tool_calls list": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": []},
         {"role": "user", "content": "and?"}], "messages[1].content"),
    "function message without name": ([{"role": "user", "content": "hi"}, {"role": "function", "content": "x"}],
                                      "messages[1].name"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_conversation_openai_refuses_is_a_400_naming_the_field(env: Env, case: str) -> None:
    messages, param = REFUSED[case]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            env.client().chat.completions.create(model="tiny", messages=messages, max_tokens=2, stream=stream)
        error: Any = refused.value.body
        assert error["param"] == param and error["type"] == "invalid_request_error", error
    env.wait_idle()


def test_a_conversation_openai_takes_is_answered(env: Env) -> None:
    answered: Any = [*ASKED, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                     {"role": "assistant", "content": ""},
                     {"role": "user", "content": [{"type": "text", "text": "ok"}]}]
    answer = env.client().chat.completions.create(model="tiny", messages=answered, max_tokens=2)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    # a provider's answer may have given its call no id: a tool result is then taken as answering it
    unnamed: Any = [ASKED[0], {"role": "assistant", "content": None, "tool_calls": [CALL | {"id": None}]},
                    {"role": "tool", "tool_call_id": "call_x", "content": "sunny"}]
    assert env.client().chat.completions.create(model="tiny", messages=unnamed, max_tokens=2).choices
    env.wait_idle()
