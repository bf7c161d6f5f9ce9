"""``POST /v1/responses`` translated to chat, with the official openai SDK as the client: a chat
provider's reasoning text as the response's reasoning item, the event stream's items each closed
before the next opens, and null optional fields read as not sent."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.loose_tool_calls import ANSWERED, STREAMED, answered, ids_kept, streamed


@pytest.fixture
def client(env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)


TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
USAGE = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}


def _answer(message: dict[str, Any], finish: str = "stop") -> Fault:
    return Fault(status=200, body={
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "usage": USAGE,
        "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant"} | message}]})


def _stream(*deltas: dict[str, Any], finish: str = "stop") -> Fault:
    envelope = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": delta}]} for delta in deltas]
    chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}, {"choices": [], "usage": USAGE}]
    return Fault(status=200, headers={"content-type": "text/event-stream"}, body=b"".join(
        b"data: " + json.dumps(envelope | c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n")


def _items(output: list[Any]) -> list[dict[str, Any]]:
    """Output items without the ids the gateway mints anew for each answer."""
    return [{k: v for k, v in item.model_dump(exclude_none=True).items() if k != "id"} for item in output]


# ---------------------------------------------------------------- reasoning


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_text_is_a_reasoning_item(client: openai.OpenAI, upstream: FakeUpstream, field: str) -> None:
    """A chat provider's reasoning text (``reasoning_content`` as vLLM and DeepSeek send it, or
    ``reasoning``) is a reasoning item before the message, streamed as a ``reasoning_text`` part."""
    upstream.fail_next(_answer({field: "think hard", "content": "hi"}),
                       _stream({"role": "assistant", field: "think"}, {field: " hard"}, {"content": "hi"}))
    response = client.responses.create(model="echo", input="x")
    with client.responses.stream(model="echo", input="x") as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events if getattr(e, "output_index", None) == 0]
    assert kinds == ["response.output_item.added", "response.content_part.added"] + \
        ["response.reasoning_text.delta"] * 2 + ["response.reasoning_text.done", "response.content_part.done",
                                                   "response.output_item.done"]
    assert [e.delta for e in events if e.type == "response.reasoning_text.delta"] == ["think", " hard"]
    expected = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think hard"}],
                 "status": "completed"},
                {"type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "hi", "annotations": []}]}]
    for final in (response, streamed, events[-1].response):  # type: ignore[union-attr]
        assert _items(final.output) == expected
        assert final.output_text == "hi"


def test_a_reasoning_item_sent_back_is_dropped(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """A reasoning item replayed in ``input`` (as clients send ``response.output`` back) is accepted
    and not sent: chat has no field for earlier reasoning (DeepSeek refuses ``reasoning_content`` in
    its input), and the answer's meaning is in the message."""
    upstream.fail_next(_answer({"reasoning_content": "think", "content": "hi"}))
    response = client.responses.create(model="echo", input="x")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    elsewhere: Any = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
                 "encrypted_content": "opaque"}  # as OpenAI's own models give it
    client.responses.create(model="echo", input=[{"role": "user", "content": "x"}, *response.output,  # type: ignore[list-item]
                                                 {"role": "user", "content": "why?"}, elsewhere])
    assert upstream.last.json["messages"] == [{"role": "user", "content": "x"},
                                              {"role": "assistant", "content": "hi"},
                                              {"role": "user", "content": "why?"}]


# ---------------------------------------------------------------- each item closed before the next opens


def test_stream_items_are_each_closed_before_the_next_opens(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """The message is done before a function call opens, and each call's events are contiguous
    even where chat interleaves parallel calls' deltas; the output indices follow the final output."""
    upstream.fail_next(_stream(
        {"content": "Let me look."},
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                         "function": {"name": "g", "arguments": '{"b":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "2}"}}]},
        {"tool_calls": [{"index": 2, "id": "call_c", "type": "function",
                         "function": {"name": "h", "arguments": "{}"}}]},
        finish="tool_calls"))
    with client.responses.stream(model="echo", input="x") as stream:
        events = list(stream)
        final = stream.get_final_response()
    indexed = [e.output_index for e in events if hasattr(e, "output_index")]
    assert indexed == sorted(indexed)  # one item's events, then the next's
    opened = [e.type for e in events if e.type.startswith("response.output_item")]
    assert opened == ["response.output_item.added", "response.output_item.done"] * 4
    args: dict[int, str] = defaultdict(str)
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            args[e.output_index] += e.delta
    assert dict(args) == {1: '{"a":1}', 2: '{"b":2}', 3: "{}"}
    assert [(i.type, getattr(i, "call_id", None), getattr(i, "arguments", None)) for i in final.output] == [
        ("message", None, None), ("function_call", "call_a", '{"a":1}'), ("function_call", "call_b", '{"b":2}'),
        ("function_call", "call_c", "{}")]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert _items(done) == _items(final.output)


def test_a_message_and_its_function_calls_are_one_chat_turn(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """An answer's text and function calls, sent back as items, are chat's one assistant message
    holding both (as the answer came), not two assistant messages in a row."""
    upstream.fail_next(_answer({"content": "Let me look.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "tool_calls"))
    response = client.responses.create(model="echo", input="x", tools=[TOOL])  # type: ignore[list-item]
    client.responses.create(model="echo", tools=[TOOL], input=[  # type: ignore[list-item]
        {"role": "user", "content": "x"}, *response.output,  # type: ignore[list-item]
        {"type": "function_call_output", "call_id": "call_1", "output": "42"}])
    assert upstream.last.json["messages"] == [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"}]


def test_a_stream_spanning_seconds_has_one_creation_time(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """``created_at`` is the response's, the same in ``response.created`` and ``response.completed``
    (and so in the stored response) however long the answer takes."""
    upstream.options.chunk_delay = 0.4
    events = list(client.responses.create(model="echo", input="one two three four", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[0].response.created_at == events[-1].response.created_at  # type: ignore[union-attr]


# ---------------------------------------------------------------- null is not set


def _post(env: GatewayEnv, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(env.base_url + "/responses", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"})


def test_null_optional_fields_are_not_set(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """``null`` for an optional field reads as the field not sent, as the API reads it."""
    r = _post(env, {"model": "echo", "input": "hi", "user": None, "tools": None, "tool_choice": None})
    assert r.status_code == 200, r.text
    response = r.json()
    assert (response["user"], response["tools"], response["tool_choice"]) == (None, [], "auto")
    assert not {"user", "tools", "tool_choice"} & set(upstream.last.json)
    r = _post(env, {"model": "echo", "input": "hi", "tools": [TOOL], "parallel_tool_calls": None})
    assert r.status_code == 200 and r.json()["parallel_tool_calls"] is True, r.text
    assert "parallel_tool_calls" not in upstream.last.json


# ---------------------------------------------------------------- what chat would refuse, or a 500


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_a_tool_choice_asking_for_nothing_without_tools_is_not_sent(env: GatewayEnv, upstream: FakeUpstream,
                                                                    choice: str) -> None:
    """OpenAI's chat refuses ``tool_choice`` without ``tools``; the Responses API does not, so a
    choice that asks for nothing there is reported back and not sent."""
    r = _post(env, {"model": "echo", "input": "hi", "tool_choice": choice})
    assert r.status_code == 200 and r.json()["tool_choice"] == choice, r.text
    assert "tool_choice" not in upstream.last.json


def test_an_answer_with_no_choice_is_a_response_with_no_output(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """A chat answer with an empty ``choices`` is a completed response with no output (as its stream
    is), not a 500."""
    upstream.fail_next(Fault(status=200, body={"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                                               "model": "m", "choices": [], "usage": USAGE}))
    response = client.responses.create(model="echo", input="x")
    assert (response.status, response.output) == ("completed", [])
    assert response.usage is not None and response.usage.output_tokens == USAGE["completion_tokens"]


# ---------------------------------------------------------------- function calls as chat providers stream them


def _call_delta(index: int, arguments: str, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "type": "function", "function": {"arguments": arguments}} | fields]}


def test_function_calls_an_upstream_gives_no_id_get_call_ids_of_their_own(client: openai.OpenAI,
                                                                         upstream: FakeUpstream) -> None:
    """A chat provider that streams its tool calls with no ``id`` (NVIDIA NIM, GLM, StepFun), or answers
    with an empty one: each function call gets a ``call_id`` of its own, the same in every event and in
    the final response, so the SDK can tell the calls apart and a ``function_call_output`` can answer
    each (the ids go to chat as the calls' and the tool messages' ids)."""
    upstream.fail_next(_stream(_call_delta(0, '{"a":1}', function={"name": "f", "arguments": '{"a":1}'}),
                               _call_delta(1, "", function={"name": "g", "arguments": ""}),
                               _call_delta(1, '{"b":2}'), finish="tool_calls"),
                       _answer({"content": None, "tool_calls": [
                           {"id": "", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                           {"id": "", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
                           "tool_calls"))
    with client.responses.stream(model="echo", input="x", tools=[TOOL]) as stream:  # type: ignore[list-item]
        events = list(stream)
        streamed = stream.get_final_response()
    answered = client.responses.create(model="echo", input="x", tools=[TOOL])  # type: ignore[list-item]
    for final in (streamed, answered):
        calls: list[Any] = [item for item in final.output if item.type == "function_call"]
        assert [c.name for c in calls] == ["f", "g"]
        ids = [c.call_id for c in calls]
        assert all(ids) and len(set(ids)) == 2
    added = [e.item.call_id for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
    assert added == [c.call_id for c in streamed.output]  # type: ignore[union-attr]
    client.responses.create(model="echo", tools=[TOOL], input=[  # type: ignore[list-item]
        {"role": "user", "content": "x"}, *streamed.output,  # type: ignore[list-item]
        *({"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in streamed.output)])
    messages = upstream.last.json["messages"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == [m["tool_call_id"] for m in messages[2:]] == added


def test_parallel_calls_an_upstream_streams_under_one_index_stay_apart(client: openai.OpenAI,
                                                                        upstream: FakeUpstream) -> None:
    """A chat provider that streams each parallel call under ``index`` 0, told apart by their ids (as
    Ollama does): each is a function call of its own, never one call with the others' arguments
    appended to its own."""
    upstream.fail_next(_stream(
        _call_delta(0, '{"city":"Paris"}', id="call_a", function={"name": "f", "arguments": '{"city":"Paris"}'}),
        _call_delta(0, '{"city":"Oslo"}', id="call_b", function={"name": "g", "arguments": '{"city":"Oslo"}'}),
        _call_delta(0, "", id="call_c", function={"name": "f", "arguments": '{"city":'}),
        _call_delta(0, '"Rome"}', id=""),  # an empty id on a later delta (DashScope's GLM) continues the call
        finish="tool_calls"))
    with client.responses.stream(model="echo", input="x", tools=[TOOL]) as stream:  # type: ignore[list-item]
        list(stream)
        final = stream.get_final_response()
    assert [(i.type, getattr(i, "call_id", None), getattr(i, "name", None), getattr(i, "arguments", None))
            for i in final.output] == [("function_call", "call_a", "f", '{"city":"Paris"}'),
                                       ("function_call", "call_b", "g", '{"city":"Oslo"}'),
                                       ("function_call", "call_c", "f", '{"city":"Rome"}')]


@pytest.mark.parametrize("case", list(STREAMED))
def test_calls_streamed_off_openais_schema_are_function_calls_each(client: openai.OpenAI, upstream: FakeUpstream,
                                                                   case: str) -> None:
    """Call deltas with no ``index`` or a null one (Gemini, older Ollama, mistral.rs), or parallel calls
    all under index 0 (Ollama): each call is a function call item of its own, with its arguments whole,
    its ``call_id`` the upstream's id (one of the gateway's own where it gave none), the same in every
    event."""
    upstream.fail_next(streamed(case))
    with client.responses.stream(model="echo", input="x", tools=[TOOL]) as stream:  # type: ignore[list-item]
        events = list(stream)
        final = stream.get_final_response()
    calls: list[Any] = [item for item in final.output if item.type == "function_call"]
    expected = STREAMED[case][1]
    assert [(c.name, c.arguments, c.status) for c in calls] == [(n, a, "completed") for _, n, a in expected]
    assert ids_kept(expected, [c.call_id for c in calls])
    added = [e.item.call_id for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
    assert added == [c.call_id for c in calls]


def test_answered_calls_without_an_id_get_call_ids_of_their_own(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """A whole answer whose calls have no ``id`` or a null one: each function call gets a ``call_id`` of
    the gateway's own, not a 502."""
    upstream.fail_next(answered())
    response = client.responses.create(model="echo", input="x", tools=[TOOL])  # type: ignore[list-item]
    calls: list[Any] = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [(n, a) for _, n, a in ANSWERED]
    assert ids_kept(ANSWERED, [c.call_id for c in calls]) and all(c.call_id.startswith("call_") for c in calls)
