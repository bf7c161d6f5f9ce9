"""``/v1/responses`` on an Anthropic deployment with extended thinking: where the signed thinking blocks
the gateway restores from reasoning items' ``encrypted_content`` go. Interleaved thinking (thinking,
tool_use, thinking, tool_use in one turn) reaches Anthropic in the order of the items that carried it;
a fallback to an OpenAI-compatible deployment gets the turn without them, while a chat client's own
``thinking_blocks`` go there as sent. The openai SDK against a gateway on loopback, a loopback server
speaking the Messages API and one speaking OpenAI's chat (the fallback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.dialects.responses_reasoning import decoded_blocks, encrypted_reasoning
from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import ScriptedAnthropic
from tests.support.fake_upstream import FakeUpstream

TOOL: Any = {"type": "function", "name": "search", "parameters": {"type": "object"}}
THINK: Any = dict(tools=[TOOL], reasoning={"effort": "low"}, max_output_tokens=4000, store=False,
                  include=["reasoning.encrypted_content"])
FIRST: dict[str, Any] = {"type": "thinking", "thinking": "first, search x", "signature": "sig-1"}
SECOND: dict[str, Any] = {"type": "thinking", "thinking": "then search y", "signature": "sig-2"}
CALL_X: dict[str, Any] = {"type": "tool_use", "id": "toolu_x", "name": "search", "input": {"q": "x"}}
CALL_Y: dict[str, Any] = {"type": "tool_use", "id": "toolu_y", "name": "search", "input": {"q": "y"}}


@pytest.fixture(scope="module")
def anthropic_upstream() -> Iterator[ScriptedAnthropic]:
    server = ScriptedAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway_url(anthropic_upstream: ScriptedAnthropic, fake_upstream_server: FakeUpstream) -> Iterator[str]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url,
                  "api_key": "sk", "anthropic_betas": ["interleaved-thinking-2025-05-14"]}
    with admin_gateway([
        {"name": "claude", "max_retries": 0, "fallbacks": ["oai"], "deployments": [deployment]},
        {"name": "oai", "max_retries": 0, "deployments": [{"provider": "openai", "model": "upstream-echo",
                                                           "api_base": fake_upstream_server.url}]},
    ]) as server:
        yield server.url


@pytest.fixture
def client(gateway_url: str, anthropic_upstream: ScriptedAnthropic,
           fake_upstream_server: FakeUpstream) -> openai.OpenAI:
    anthropic_upstream.received.clear()
    anthropic_upstream.faults.clear()
    anthropic_upstream.script = None
    fake_upstream_server.reset()
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def reasoning(*blocks: dict[str, Any]) -> Any:
    """A reasoning item as Codex sends the gateway's back: its blob, no text."""
    return {"type": "reasoning", "summary": [],
            "encrypted_content": encrypted_reasoning("".join(b["thinking"] for b in blocks), list(blocks))}


def call(block: dict[str, Any]) -> Any:
    return {"type": "function_call", "call_id": block["id"], "name": "search", "arguments": json.dumps(block["input"])}


def answered(block: dict[str, Any]) -> Any:
    return {"type": "function_call_output", "call_id": block["id"], "output": "found"}


def assistant_turn(upstream: ScriptedAnthropic) -> list[dict[str, Any]]:
    turns = [m["content"] for m in upstream.received[-1]["messages"] if m["role"] == "assistant"]
    assert len(turns) == 1
    return turns[0]


def _interleaved_stream() -> list[tuple[str, dict[str, Any]]]:
    """Anthropic's stream of an interleaved thinking turn: thinking, tool_use, thinking, tool_use."""
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": {
        "id": "msg_i", "type": "message", "role": "assistant", "model": "m", "content": [],
        "usage": {"input_tokens": 3, "output_tokens": 1}}})]
    for index, block in enumerate((FIRST, CALL_X, SECOND, CALL_Y)):
        start: dict[str, Any]
        if block["type"] == "thinking":
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
            start = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
            start = block | {"input": {}}
        events += [("content_block_start", {"index": index, "content_block": start}),
                   *(("content_block_delta", {"index": index, "delta": d}) for d in deltas),
                   ("content_block_stop", {"index": index})]
    return events + [("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                        "usage": {"output_tokens": 9}}), ("message_stop", {})]


def test_interleaved_thinking_goes_back_in_the_order_of_its_items(
        client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic) -> None:
    answer = client.responses.create(model="claude", **THINK, input=[
        {"role": "user", "content": "tool:x"}, reasoning(FIRST), call(CALL_X), reasoning(SECOND), call(CALL_Y),
        answered(CALL_X), answered(CALL_Y)])
    assert answer.status == "completed"
    assert assistant_turn(anthropic_upstream) == [FIRST, CALL_X, SECOND, CALL_Y]


def test_a_text_between_thinking_keeps_its_place(client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic) -> None:
    client.responses.create(model="claude", **THINK, input=[
        {"role": "user", "content": "tool:x"}, reasoning(FIRST), {"role": "assistant", "content": "looking"},
        reasoning(SECOND), call(CALL_X), answered(CALL_X)])
    assert assistant_turn(anthropic_upstream) == [FIRST, {"type": "text", "text": "looking"}, SECOND, CALL_X]


def test_an_interleaved_stream_round_trips(client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic) -> None:
    """The answer's items keep Anthropic's order, each reasoning item with its own block; sent back, the
    turn reaches Anthropic as it came."""
    anthropic_upstream.script = _interleaved_stream()
    with client.responses.stream(model="claude", **THINK, input="tool:x") as events:
        output: Any = events.get_final_response().output
    assert [item.type for item in output] == ["reasoning", "function_call", "reasoning", "function_call"]
    assert [decoded_blocks(output[i].encrypted_content) for i in (0, 2)] == [[FIRST], [SECOND]]
    sent: Any = [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "status", "content")}
            for item in output]
    client.responses.create(model="claude", **THINK, input=[
        {"role": "user", "content": "tool:x"}, *sent, answered(CALL_X), answered(CALL_Y)])
    assert assistant_turn(anthropic_upstream) == [FIRST, CALL_X, SECOND, CALL_Y]


INTERLEAVED_ANSWER: Any = (200, {"id": "msg_n", "type": "message", "role": "assistant", "model": "m",
                                 "content": [FIRST, CALL_X, SECOND, CALL_Y], "stop_reason": "tool_use",
                                 "usage": {"input_tokens": 3, "output_tokens": 9}})


def test_an_interleaved_answer_round_trips(client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic) -> None:
    """Not streamed, the answer's items keep Anthropic's order too, each reasoning item with its own
    block and text; sent back, the turn reaches Anthropic as it came."""
    anthropic_upstream.script = INTERLEAVED_ANSWER
    output: Any = client.responses.create(model="claude", **THINK, input="tool:x").output
    assert [item.type for item in output] == ["reasoning", "function_call", "reasoning", "function_call"]
    assert [decoded_blocks(output[i].encrypted_content) for i in (0, 2)] == [[FIRST], [SECOND]]
    assert [output[i].content[0].text for i in (0, 2)] == [FIRST["thinking"], SECOND["thinking"]]
    assert [output[i].call_id for i in (1, 3)] == ["toolu_x", "toolu_y"]
    sent: Any = [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "status", "content")}
            for item in output]
    client.responses.create(model="claude", **THINK, input=[
        {"role": "user", "content": "tool:x"}, *sent, answered(CALL_X), answered(CALL_Y)])
    assert assistant_turn(anthropic_upstream) == [FIRST, CALL_X, SECOND, CALL_Y]


def test_a_chat_client_gets_an_interleaved_answers_blocks_as_before(
        client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic) -> None:
    anthropic_upstream.script = INTERLEAVED_ANSWER
    message: Any = client.chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "tool:x"}]).choices[0].message
    assert message.thinking_blocks == [FIRST, SECOND]
    assert message.reasoning_content == FIRST["thinking"] + SECOND["thinking"]
    assert [c.id for c in message.tool_calls] == ["toolu_x", "toolu_y"]


def test_a_fallback_to_openai_gets_no_gateway_made_thinking_blocks(
        client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic, fake_upstream_server: FakeUpstream) -> None:
    anthropic_upstream.fail_next(529, "overloaded_error", "overloaded")
    answer = client.responses.create(model="claude", **THINK, input=[
        {"role": "user", "content": "tool:x"}, reasoning(FIRST), call(CALL_X), answered(CALL_X)])
    assert answer.status == "completed"
    assert len(anthropic_upstream.received) == 1  # tried first, then the fallback
    messages = fake_upstream_server.last.json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert "thinking_blocks" not in messages[1]
    assert messages[1]["tool_calls"][0]["id"] == "toolu_x"


def test_a_chat_clients_own_thinking_blocks_reach_the_fallback_as_sent(
        client: openai.OpenAI, anthropic_upstream: ScriptedAnthropic, fake_upstream_server: FakeUpstream) -> None:
    anthropic_upstream.fail_next(529, "overloaded_error", "overloaded")
    turn: Any = {"role": "assistant", "content": None, "thinking_blocks": [FIRST],
            "tool_calls": [{"id": "toolu_x", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}
    client.chat.completions.create(model="claude", messages=[
        {"role": "user", "content": "tool:x"}, turn, {"role": "tool", "tool_call_id": "toolu_x", "content": "found"}])
    assert fake_upstream_server.last.json["messages"][1]["thinking_blocks"] == [FIRST]
