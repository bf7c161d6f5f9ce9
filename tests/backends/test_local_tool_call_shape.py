"""A forced tool call (a named ``tool_choice``, or ``required``) on the built-in engine has OpenAI's
shape, read raw off the wire through the openai SDK: the stream's first chunk is the assistant role
with ``content: null`` (a named function's first chunk carries the call's id and name too, as
OpenAI's does), no tool-call delta carries ``content``, and the whole message's content is null."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from tests.backends.test_local_tools import MESSAGES, NAMED, TOOLS, WEATHER
from tests.support.local_gateway import Env, local_gateway


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("tool_shape")) as s:
        yield s


def _raw_chunks(env: Env, body: dict[str, Any]) -> list[dict[str, Any]]:
    with env.client().chat.completions.with_streaming_response.create(**body, stream=True) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_a_forced_calls_stream_has_openais_shape(env: Env, tool_choice: Any) -> None:
    body = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=300,
                temperature=1.0, seed=3, parallel_tool_calls=False)
    deltas = [c["choices"][0]["delta"] for c in _raw_chunks(env, body) if c["choices"]]
    first = deltas[0]
    assert first["role"] == "assistant" and "content" in first and first["content"] is None
    if tool_choice == NAMED:  # OpenAI's: the role, content null and the call's head in one chunk
        head = first["tool_calls"][0]
        assert head["index"] == 0 and head["id"] and head["type"] == "function"
        assert head["function"] == {"name": "get_weather", "arguments": ""}
    assert all("role" not in d for d in deltas[1:])
    assert all("content" not in d for d in deltas[1:] if d.get("tool_calls"))  # only the first says null
    assert all(d.get("content") is None for d in deltas)  # no "" anywhere
    calls = [t for d in deltas for t in d.get("tool_calls") or []]
    assert calls[0]["id"] and [t for t in calls if "id" in t] == calls[:1]
    arguments = "".join(t["function"]["arguments"] for t in calls)
    if tool_choice == NAMED:
        jsonschema.validate(json.loads(arguments), WEATHER)


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_a_forced_calls_whole_message_has_null_content(env: Env, tool_choice: Any) -> None:
    body = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=300,
                temperature=1.0, seed=3, parallel_tool_calls=False)
    raw = env.client().chat.completions.with_raw_response.create(**body)
    message = json.loads(raw.http_response.text)["choices"][0]["message"]
    assert "content" in message and message["content"] is None and message["tool_calls"]


def test_a_named_call_still_parses_with_the_sdk(env: Env) -> None:
    """The SDK's own chunk types read the merged first chunk: one call, its name once."""
    stream = env.client().chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=NAMED,
                                                  max_tokens=200, stream=True)
    names, args = [], ""
    for chunk in stream:
        for choice in chunk.choices:
            assert choice.delta.content is None
            for d in choice.delta.tool_calls or []:
                names += [d.function.name] if d.function and d.function.name else []
                args += (d.function.arguments or "") if d.function else ""
    assert names == ["get_weather"]
    jsonschema.validate(json.loads(args), WEATHER)
