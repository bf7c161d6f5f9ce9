"""Edges of the chat -> Messages API translation an openai SDK client meets calling Claude: empty
messages and parts in a conversation, a tool call with no arguments, and the SDK's strict stream
helper over tool calls, against a loopback server speaking the Messages API."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.backends.claude_gateway import client, gateway_url, upstream  # noqa: F401  (fixtures)
from tests.support.fake_anthropic import ScriptedAnthropic

TOOLS: Any = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
START = ("message_start", {"message": {"id": "msg_e", "type": "message", "role": "assistant", "model": "m",
                                       "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}})


def tool_block(index: int, call_id: str, *pieces: str) -> list[tuple[str, dict[str, Any]]]:
    """A streamed tool_use block whose input comes as ``pieces`` (Anthropic sends one empty piece for {})."""
    return [("content_block_start", {"index": index, "content_block": {"type": "tool_use", "id": call_id,
                                                                       "name": "search", "input": {}}}),
            *[("content_block_delta", {"index": index, "delta": {"type": "input_json_delta", "partial_json": p}})
              for p in pieces],
            ("content_block_stop", {"index": index})]


END = [("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                          "usage": {"output_tokens": 5}}), ("message_stop", {})]


# ------------------------------------------------------------ empty messages and parts


@pytest.mark.parametrize("empty", ["", "\n\n", [], [{"type": "text", "text": ""}]])
def test_an_empty_assistant_message_leaves_no_empty_message_upstream(
        client: openai.OpenAI, upstream: ScriptedAnthropic, empty: Any) -> None:
    """Anthropic refuses a message with no content, and a text block of whitespace only: an assistant
    turn that said nothing ("", as an OpenAI answer can be) is left out, and the user turns around it merge."""
    client.chat.completions.create(model="claude", messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": empty}, {"role": "user", "content": "b"}])
    sent = upstream.received[-1]["messages"]
    assert sent == [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]


def test_an_empty_text_part_is_not_sent(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": [
        {"type": "text", "text": ""}, {"type": "text", "text": " "}, {"type": "text", "text": "hi"}]}])
    assert upstream.received[-1]["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": " "}],
     "messages[2].content"),
    ([{"role": "system", "content": "s"}, {"role": "assistant", "content": ""}], "messages")])
def test_an_empty_user_message_or_conversation_is_a_400_of_the_gateways(
        client: openai.OpenAI, upstream: ScriptedAnthropic, messages: Any, param: str) -> None:
    """An empty user message is not left out (the assistant's turn before it would be continued, not
    answered): a 400 naming it, as a conversation with nothing to send is, not Anthropic's own."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=messages)
    assert refused.value.param == param and upstream.received == []


@pytest.mark.parametrize("prefill", ["The answer is ",
                                     [{"type": "text", "text": "Say"}, {"type": "text", "text": "it:\n"}]])
def test_a_final_assistant_message_ending_in_whitespace_is_sent_without_it(
        client: openai.OpenAI, upstream: ScriptedAnthropic, prefill: Any) -> None:
    """A final assistant message is a prefill on Anthropic, which refuses one ending in whitespace (its
    400 "final assistant content cannot end with trailing whitespace"): its last text goes without
    that whitespace (as LiteLLM sends it), an assistant turn before the last one as it came."""
    answer = client.chat.completions.create(model="claude", messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "x \n"}, {"role": "user", "content": "b"},
        {"role": "assistant", "content": prefill}])
    sent = upstream.received[-1]["messages"]
    assert sent[1]["content"] == [{"type": "text", "text": "x \n"}]
    assert sent[-1]["content"][-1]["text"] in ("The answer is", "it:") and answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("arguments", ["[1, 2]", '"text"', "null", "not json"])
def test_a_conversations_call_whose_arguments_are_no_object_is_a_400_naming_them(
        client: openai.OpenAI, upstream: ScriptedAnthropic, arguments: str) -> None:
    """A tool_use block's input is a JSON object, which Anthropic refuses anything else for: a call in the
    conversation whose arguments are another JSON value (or no JSON) is a 400 naming them, not sent."""
    call: Any = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": arguments}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", tools=TOOLS, messages=[
            {"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}])
    assert refused.value.param == "messages[1].tool_calls[0].function.arguments" and upstream.received == []


# ------------------------------------------------------------ tool calls streamed


def test_a_streamed_call_with_no_arguments_has_the_arguments_of_an_empty_object(
        client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """A tool_use with input {} streams one empty input_json_delta: the call's arguments are "{}" (as
    the whole answer's are, and as a client's json.loads needs), not ""."""
    upstream.script = [START, *tool_block(0, "tu_a", ""), *tool_block(1, "tu_b"), *END]
    with client.chat.completions.stream(model="claude", tools=TOOLS,
                                        messages=[{"role": "user", "content": "x"}]) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [(c.id, c.function.arguments) for c in calls] == [("tu_a", "{}"), ("tu_b", "{}")]
    assert final.choices[0].finish_reason == "tool_calls"


def test_the_sdks_stream_helper_takes_text_and_parallel_calls(client: openai.OpenAI,
                                                              upstream: ScriptedAnthropic) -> None:
    text = [("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "let me see"}}),
            ("content_block_stop", {"index": 0})]
    upstream.script = [START, ("ping", {}), *text, *tool_block(1, "tu_a", '{"q": ', '"a"}'),
                       *tool_block(2, "tu_b", '{"q": "b"}'), *END]
    with client.chat.completions.stream(model="claude", tools=TOOLS,
                                        messages=[{"role": "user", "content": "x"}]) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "let me see"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("tu_a", "search", '{"q": "a"}'), ("tu_b", "search", '{"q": "b"}')]


# ------------------------------------------------------------ the request's fields


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_output_limit_of_zero_is_a_400_naming_it_not_the_default(client: openai.OpenAI,
                                                                    upstream: ScriptedAnthropic, field: str) -> None:
    """Anthropic's max_tokens is at least 1: a limit of 0 is refused naming the client's field, never
    replaced by the deployment's default (an answer of thousands of tokens the client capped at none)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}],
                                       **{field: 0})  # type: ignore[call-overload]
    assert refused.value.param == field and upstream.received == []


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "search"}}])
def test_a_forced_tool_with_reasoning_effort_is_a_400_naming_tool_choice(
        client: openai.OpenAI, upstream: ScriptedAnthropic, choice: Any) -> None:
    """Anthropic's extended thinking forces no tool (its own 400 would name neither field)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                                       tool_choice=choice, reasoning_effort="low", max_completion_tokens=4000)
    assert refused.value.param == "tool_choice" and upstream.received == []


@pytest.mark.parametrize(("url", "media_type"), [("data:image/jpg;base64,AAAA", "image/jpeg"),
                                                 ("data:IMAGE/PNG;base64,AAAA", "image/png"),
                                                 ("data:image/webp;name=a.webp;base64,AAAA", "image/webp")])
def test_an_images_media_type_is_one_anthropic_takes(client: openai.OpenAI, upstream: ScriptedAnthropic,
                                                     url: str, media_type: str) -> None:
    """Anthropic takes image/jpeg, png, gif and webp exactly: a data URL's "image/jpg" (as browsers and
    many clients write JPEGs), upper case or parameters are the same type, sent as Anthropic names it."""
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it"}]}])
    image = upstream.received[-1]["messages"][0]["content"][0]
    assert image == {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": "AAAA"}}


def test_stop_sequences_anthropic_takes(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """An empty stop string stops nowhere and is not sent (Anthropic refuses it); one of whitespace
    only ("\\n", as completion-style clients send) Anthropic cannot stop at: a 400 naming stop, not
    its own 400 naming stop_sequences, a field the client never sent."""
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], stop=["", "END"])
    assert upstream.received[-1]["stop_sequences"] == ["END"]
    upstream.received.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], stop=["END", "\n"])
    assert refused.value.param == "stop" and upstream.received == []


# ------------------------------------------------------------ who the end user is: metadata.user_id


@pytest.mark.parametrize(("fields", "user_id"), [
    ({"safety_identifier": "s-1"}, "s-1"),
    ({"user": "u-1"}, "u-1"),
    ({"user": "u-1", "safety_identifier": "s-1"}, "s-1"),  # OpenAI's replacement of ``user`` wins
    ({"user": "u-1", "safety_identifier": "s-1", "metadata": {"user_id": "m-1"}}, "m-1"),  # Anthropic's own
])
def test_the_end_user_goes_to_anthropic_as_metadata_user_id(
        client: openai.OpenAI, upstream: ScriptedAnthropic, fields: dict[str, Any], user_id: str) -> None:
    """``safety_identifier`` (and the ``user`` it replaces) name the end user, as Anthropic's
    ``metadata.user_id`` does: mapped to it, not dropped."""
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}], **fields)
    sent = upstream.received[-1]
    assert sent["metadata"] == {"user_id": user_id} and "safety_identifier" not in sent and "user" not in sent


@pytest.mark.parametrize(("metadata", "param"), [
    ({"trace": "t1"}, "metadata.trace"),
    ({"user_id": "u", "trace": "t1"}, "metadata.trace"),
    ({"user_id": 7}, "metadata.user_id"),
])
def test_a_metadata_key_anthropic_refuses_is_a_400_of_the_gateways(
        client: openai.OpenAI, upstream: ScriptedAnthropic, metadata: Any, param: str) -> None:
    """OpenAI's ``metadata`` (tags of a stored completion) takes any key; Anthropic's takes ``user_id``
    alone and refuses a request with another: a 400 naming the key, and nothing sent upstream."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}],
                                       metadata=metadata, store=True)
    error = err.value.body
    assert isinstance(error, dict) and error["param"] == param and error["type"] == "invalid_request_error", error
    assert param in error["message"] and "anthropic" in error["message"], error
    assert upstream.received == []


def test_metadata_that_is_no_object_is_a_400_and_null_asks_for_nothing(
        client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"metadata": "t1"})
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "metadata", err.value.body
    assert upstream.received == []
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}], user="u-1",
                                   extra_body={"metadata": None})
    assert upstream.received[-1]["metadata"] == {"user_id": "u-1"}
