"""``POST /v1/messages`` answered by an OpenAI upstream whose tool call's ``arguments`` are not a JSON
object (invalid JSON from a small model, an array, a string): a ``tool_use`` block's ``input`` cannot
hold them, so the whole answer is a 502 in Anthropic's shape naming the call and quoting its text (not
``input: {}``), and a stream relays the text as sent, then ends with an ``error`` event. Either way
the upstream's usage is what the request is charged. A call cut by the length limit or a stop
sequence is Anthropic's incomplete block with ``stop_reason: max_tokens`` / ``stop_sequence`` instead."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault

SSE = {"content-type": "text/event-stream"}
USAGE = {"prompt_tokens": 11, "completion_tokens": 13, "total_tokens": 24}
UNUSABLE = ['{"city": "Par', "[1, 2]", '"Paris"', "not json at all"]
KW: Any = {"model": "echo", "max_tokens": 64, "messages": [{"role": "user", "content": "weather?"}],
           "tools": [{"name": "weather", "input_schema": {"type": "object"}}]}


def _answer(arguments: str, finish: str = "tool_calls", matched: str | None = None) -> dict[str, Any]:
    call = {"id": "call_7", "type": "function", "function": {"name": "weather", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "usage": USAGE,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": matched}]}


def _events(arguments: str, finish: str = "tool_calls", matched: str | None = None) -> bytes:
    """The call's arguments in two pieces, then the finish and the usage (as include_usage asks)."""
    half = len(arguments) // 2
    deltas: list[dict[str, Any]] = [
        {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_7", "type": "function",
                                              "function": {"name": "weather", "arguments": arguments[:half]}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]}, {}]
    chunks = [{"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
               "choices": [{"index": 0, "delta": d, "finish_reason": None if d else finish,
                            "stop_reason": None if d else matched}]} for d in deltas]
    chunks.append({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
                   "usage": USAGE})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _sse(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of each event of an Anthropic stream."""
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.fixture
def client(env: GatewayEnv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.server.url, api_key=ADMIN_KEY, max_retries=0)


@pytest.mark.parametrize("arguments", UNUSABLE)
def test_a_whole_answer_with_unusable_arguments_is_a_502_naming_the_call(
        client: anthropic.Anthropic, env: GatewayEnv, upstream: FakeUpstream, arguments: str) -> None:
    upstream.fail_next(Fault(status=200, body=_answer(arguments)))
    with pytest.raises(anthropic.InternalServerError) as failed:
        client.messages.create(**KW)
    assert failed.value.status_code == 502
    body: Any = failed.value.body
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    message = body["error"]["message"]
    assert "'call_7' ('weather')" in message and "not a JSON object" in message
    assert repr(arguments) in message  # the text, not lost
    [record] = env.usage.wait_for(1)
    assert (record.status, record.error_type) == (502, "untranslatable_answer")
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (11, 13, True)  # the upstream's usage


@pytest.mark.parametrize("arguments", UNUSABLE)
def test_a_stream_relays_unusable_arguments_as_sent_then_fails_the_same_way(
        env: GatewayEnv, upstream: FakeUpstream, arguments: str) -> None:
    upstream.fail_next(Fault(status=200, body=_events(arguments), headers=SSE))
    response = httpx.post(env.server.url + "/v1/messages", json=KW | {"stream": True},
                          headers={"x-api-key": ADMIN_KEY}, timeout=10)
    events = _sse(response.text)
    relayed = "".join(e["delta"]["partial_json"] for kind, e in events if kind == "content_block_delta")
    assert relayed == arguments
    kind, last = events[-1]
    assert kind == "error" and last["error"]["type"] == "api_error"
    assert "'call_7' ('weather')" in last["error"]["message"] and "not a JSON object" in last["error"]["message"]
    assert "message_stop" not in [k for k, _ in events]
    [record] = env.usage.wait_for(1)
    assert (record.error_type, record.extra) == ("untranslatable_answer", {"outcome": "failed"})
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (11, 13, True)


@pytest.mark.parametrize("arguments", ['{"city": "Paris"}', ""])
def test_arguments_that_are_an_object_or_none_are_the_input(
        client: anthropic.Anthropic, upstream: FakeUpstream, arguments: str) -> None:
    expected = json.loads(arguments or "{}")
    upstream.fail_next(Fault(status=200, body=_answer(arguments)))
    whole = client.messages.create(**KW)
    upstream.fail_next(Fault(status=200, body=_events(arguments), headers=SSE))
    with client.messages.stream(**KW) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        [block] = message.content
        assert block.type == "tool_use" and block.id == "call_7" and block.input == expected
        assert message.stop_reason == "tool_use"


@pytest.mark.parametrize(("finish", "matched", "reason"), [("length", None, "max_tokens"),
                                                          ("stop", "Par", "stop_sequence")])
def test_a_call_cut_by_the_length_limit_or_a_stop_sequence_is_an_incomplete_block_not_a_failure(
        client: anthropic.Anthropic, env: GatewayEnv, upstream: FakeUpstream, finish: str, matched: str | None,
        reason: str) -> None:
    """As Anthropic answers a tool call cut by ``max_tokens`` or a stop sequence: the block, with that
    ``stop_reason`` (the client knows why), whole or streamed (the text relayed as sent)."""
    cut = '{"city": "'
    upstream.fail_next(Fault(status=200, body=_answer(cut, finish, matched)))
    whole = client.messages.create(**KW)
    assert (whole.stop_reason, whole.content[0].type, whole.content[0].input) == (reason, "tool_use", {})
    upstream.fail_next(Fault(status=200, body=_events(cut, finish, matched), headers=SSE))
    response = httpx.post(env.server.url + "/v1/messages", json=KW | {"stream": True},
                          headers={"x-api-key": ADMIN_KEY}, timeout=10)
    events = _sse(response.text)
    assert "".join(e["delta"]["partial_json"] for kind, e in events if kind == "content_block_delta") == cut
    assert [k for k, _ in events][-2:] == ["message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == reason
    records = env.usage.wait_for(2)
    assert [(r.status, r.error_type) for r in records] == [(200, None), (200, None)]
