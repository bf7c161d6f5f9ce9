"""Streaming ``tool_choice: auto`` (``backends.local.tool_stream``): content goes out as it is
generated, held only from where a call may start; at the end the held text is calls or content,
and the content streamed is the whole answer's, for each parser's format."""

from __future__ import annotations

import json

import pytest

from backends.local import tools
from backends.local.tool_parsers import PARSERS
from backends.local.tool_stream import StreamingToolParser
from backends.local.tools import ToolPlan

HERMES_CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
MISTRAL_CALL = '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]'
LLAMA3_CALL = '<|python_tag|>{"name": "f", "parameters": {"a": 1}}'


def run(parser: str, pieces: list[str]) -> tuple[list[str], str, list[tuple[str, object]]]:
    """What each piece released, the content released at the end, and the calls."""
    stream = StreamingToolParser(parser, PARSERS[parser])
    sent = [stream.feed(p) for p in pieces]
    rest, calls = stream.finish()
    return sent, rest, [(c.name, json.loads(c.arguments)) for c in calls]


def chars(text: str) -> list[str]:
    return list(text)


@pytest.mark.parametrize(("parser", "call"), [("hermes", HERMES_CALL), ("mistral", MISTRAL_CALL)])
def test_content_before_a_call_streams_at_once(parser: str, call: str) -> None:
    sent, rest, calls = run(parser, ["Let me ", "check.\n", *chars(call)])
    assert sent[:2] == ["Let me ", "check.\n"] and not any(sent[2:])
    assert rest == "" and calls == [("f", {"a": 1})]
    assert PARSERS[parser]("Let me check.\n" + call)[0] == "Let me check.\n"  # the whole answer agrees


@pytest.mark.parametrize(("parser", "marker"), [("hermes", "<tool_call>"), ("mistral", "[TOOL_CALLS]")])
def test_a_partial_marker_is_held_then_released(parser: str, marker: str) -> None:
    stream = StreamingToolParser(parser, PARSERS[parser])
    assert stream.feed("a " + marker[:5]) == "a "  # may be a call starting: held
    assert stream.feed(marker[5:7]) == ""
    assert stream.feed("!x") == marker[:7] + "!x"  # it was not: released with what follows
    assert stream.finish() == ("", [])


def test_a_partial_marker_at_the_end_is_content() -> None:
    sent, rest, calls = run("hermes", ["so 1 ", "<tool"])
    assert sent == ["so 1 ", ""] and rest == "<tool" and calls == []


def test_llama3_holds_only_an_output_that_may_be_a_call() -> None:
    sent, rest, calls = run("llama3", [" \n", "Paris", " is ", "sunny {"])
    assert sent == ["", " \nParis", " is ", "sunny {"] and rest == "" and calls == []
    sent, rest, calls = run("llama3", chars(LLAMA3_CALL))
    assert not any(sent) and rest == "" and calls == [("f", {"a": 1})]
    sent, rest, calls = run("llama3", ["<|py", "thon!", " more"])  # not the tag after all
    assert sent == ["", "<|python!", " more"] and calls == []
    sent, rest, calls = run("llama3", ["\n", '{"nope": ', "1}"])  # JSON, but no call: content at the end
    assert not any(sent) and rest == '\n{"nope": 1}' and calls == []


@pytest.mark.parametrize(("parser", "text"), [
    ("hermes", 'Sure <tool_call>{"name": "f", "arguments": {"a": </tool_call> done'),
    ("mistral", "ok [TOOL_CALLS] [{not json"),
    ("llama3", '{"name": "f", "parameters": {"a": 1}'),
])
def test_a_call_that_does_not_parse_is_released_as_content(parser: str, text: str) -> None:
    sent, rest, calls = run(parser, chars(text))
    assert calls == [] and "".join(sent) + rest == text


@pytest.mark.parametrize("parser", ["hermes", "mistral", "llama3"])
@pytest.mark.parametrize("text", [
    "plain answer", "  spaced  \n", "", "a\n\n" + HERMES_CALL + "\n" + HERMES_CALL, "b " + MISTRAL_CALL,
    "\n" + LLAMA3_CALL, '{"name": "g", "parameters": {}}; {"name": "f", "parameters": {"a": 1}}',
    "<tool_call>" + "<tool_call>", "x [TOOL_CALLS", "<|python_tag|> hi", HERMES_CALL + " trailing",
])
@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_content_is_the_whole_answers(parser: str, text: str, step: int) -> None:
    plan = ToolPlan([], "auto", None, parallel=True, parser=parser)
    whole, reason = tools.message(plan, text, "stop")
    stream = plan.streaming()
    sent = "".join(stream.feed(text[i:i + step]) for i in range(0, len(text), step))
    closing = tools.streamed_final_deltas(stream, 0, "stop")
    content = sent + "".join(c.delta.content for c in closing if isinstance(c.delta.content, str))
    assert (content or None) == (whole.content or None)
    streamed_calls = [(d.function["name"], d.function["arguments"]) for c in closing
                      if isinstance(c.delta.tool_calls, list) for d in c.delta.tool_calls
                      if isinstance(d.function, dict)]
    assert streamed_calls == [(t.function.name, t.function.arguments) for t in whole.tool_calls or []]
    assert closing[-1].finish_reason == reason


def test_an_output_cut_by_the_length_limit_is_content() -> None:
    plan = ToolPlan([], "auto", None, parallel=True, parser="hermes")
    stream = plan.streaming()
    assert stream.feed("hi " + HERMES_CALL) == "hi "
    closing = tools.streamed_final_deltas(stream, 0, "length")
    assert [c.delta.content for c in closing[:-1]] == [HERMES_CALL] and closing[-1].finish_reason == "length"
