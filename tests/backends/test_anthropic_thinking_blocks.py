"""Extended thinking's blocks for chat clients of an Anthropic upstream, as LiteLLM carries them
(``thinking_blocks``): an answer's, signatures included; a stream's pieces; and an assistant turn
sent back with them, which Anthropic needs to continue after a tool call while thinking. The openai
SDK against a gateway on loopback and a loopback server speaking the Messages API (which refuses a
tool turn sent back without its signed thinking, as Anthropic does)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.backends.claude_gateway import client, gateway_url, upstream  # noqa: F401  (fixtures)
from tests.support.fake_anthropic import ScriptedAnthropic

TOOLS: Any = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
THINK: Any = dict(model="claude", max_completion_tokens=4000, reasoning_effort="low")
SIGNED = {"type": "thinking", "thinking": "let me think", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
START = ("message_start", {"message": {"id": "msg_t", "type": "message", "role": "assistant", "model": "m",
                                       "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}})
END = [("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                          "usage": {"output_tokens": 5}}), ("message_stop", {})]


def joined(pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stream's ``thinking_blocks`` pieces joined into blocks: a thinking block's pieces until its
    signature; a redacted block comes whole."""
    blocks: list[dict[str, Any]] = []
    for piece in pieces:
        if piece["type"] == "thinking" and blocks and blocks[-1]["type"] == "thinking" \
                and not blocks[-1]["signature"]:
            blocks[-1]["thinking"] += piece["thinking"]
            blocks[-1]["signature"] += piece.get("signature", "")
        else:
            blocks.append(dict(piece))
    return blocks


def stream_pieces(client: openai.OpenAI, **kw: Any) -> tuple[list[dict[str, Any]], str]:
    pieces: list[dict[str, Any]] = []
    reasoning = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            pieces += getattr(choice.delta, "thinking_blocks", None) or []
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
    return pieces, reasoning


def test_an_answer_carries_its_thinking_blocks_with_their_signatures(
        client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    reply = client.chat.completions.create(**THINK, messages=[{"role": "user", "content": "hi"}])
    message = reply.choices[0].message
    assert message.thinking_blocks == [SIGNED]  # type: ignore[attr-defined]
    assert message.reasoning_content == "let me think"  # type: ignore[attr-defined]
    upstream.script = (200, {"id": "msg_r", "type": "message", "role": "assistant", "model": "m",
                             "content": [REDACTED, SIGNED, {"type": "text", "text": "ok"}],
                             "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 4}})
    message = client.chat.completions.create(**THINK, messages=[{"role": "user", "content": "hi"}]).choices[0].message
    assert message.thinking_blocks == [REDACTED, SIGNED] and message.content == "ok"  # type: ignore[attr-defined]


def test_a_streams_deltas_carry_the_blocks_pieces(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """As LiteLLM streams them: each thinking piece, then the signature, as a one-block list; a redacted
    block whole. Joined, they are the answer's blocks."""
    pieces, reasoning = stream_pieces(client, **THINK, messages=[{"role": "user", "content": "hi"}])
    assert pieces == [{"type": "thinking", "thinking": "let me think", "signature": ""},
                      {"type": "thinking", "thinking": "", "signature": "sig-1"}]
    assert joined(pieces) == [SIGNED] and reasoning == "let me think"
    upstream.script = [START, ("content_block_start", {"index": 0, "content_block": REDACTED}),
                       ("content_block_stop", {"index": 0}),
                       ("content_block_start", {"index": 1, "content_block": {"type": "thinking", "thinking": "",
                                                                              "signature": ""}}),
                       *[("content_block_delta", {"index": 1, "delta": {"type": "thinking_delta", "thinking": t}})
                         for t in ("let me ", "think")],
                       ("content_block_delta", {"index": 1, "delta": {"type": "signature_delta",
                                                                      "signature": "sig-1"}}),
                       ("content_block_stop", {"index": 1}), *END]
    pieces, reasoning = stream_pieces(client, **THINK, messages=[{"role": "user", "content": "hi"}])
    assert joined(pieces) == [REDACTED, SIGNED] and reasoning == "let me think"


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_turn_sent_back_keeps_its_signed_thinking_first(
        client: openai.OpenAI, upstream: ScriptedAnthropic, stream: bool) -> None:
    """The conversation goes on after a tool call with thinking on: the assistant message, sent back as
    the SDK gave it (thinking_blocks beside tool_calls), reaches Anthropic with its thinking block first."""
    history: list[Any] = [{"role": "user", "content": "tool:weather"}]
    if stream:
        pieces, _ = stream_pieces(client, **THINK, tools=TOOLS, messages=history)
        call = {"id": "toolu_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "weather"}'}}
        history.append({"role": "assistant", "content": None, "tool_calls": [call], "thinking_blocks": joined(pieces)})
    else:
        reply = client.chat.completions.create(**THINK, tools=TOOLS, messages=history)
        assert reply.choices[0].finish_reason == "tool_calls"
        history.append(reply.choices[0].message.model_dump(exclude_none=True))
    history.append({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
    reply = client.chat.completions.create(**THINK, tools=TOOLS, messages=history)
    assert reply.choices[0].message.content
    turn = upstream.received[-1]["messages"][1]
    assert turn["role"] == "assistant"
    assert [b["type"] for b in turn["content"]] == ["thinking", "tool_use"] and turn["content"][0] == SIGNED


def test_a_tool_turn_sent_back_without_its_thinking_is_refused_upstream(
        client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """What the fake upstream enforces (as Anthropic does), and what thinking_blocks are for."""
    call = {"id": "toolu_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**THINK, tools=TOOLS, messages=[
            {"role": "user", "content": "tool:x"}, {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}])


def test_redacted_thinking_is_sent_back_unchanged(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    call = {"id": "toolu_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    blocks = [REDACTED | {"cache_control": {"type": "ephemeral"}}, SIGNED]
    client.chat.completions.create(**THINK, tools=TOOLS, messages=[  # type: ignore[misc]
        {"role": "user", "content": "tool:x"},
        {"role": "assistant", "content": "looking", "tool_calls": [call], "thinking_blocks": blocks},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}])
    assert upstream.received[-1]["messages"][1]["content"] == [
        *blocks, {"type": "text", "text": "looking"}, {"type": "tool_use", "id": "toolu_1", "name": "search",
                                                       "input": {}}]


@pytest.mark.parametrize(("blocks", "param"), [
    ("nope", "messages[1].thinking_blocks"),
    (["x"], "messages[1].thinking_blocks[0]"),
    ([{"type": "text", "text": "x"}], "messages[1].thinking_blocks[0].type"),
    ([SIGNED, {"type": "thinking", "thinking": "x"}], "messages[1].thinking_blocks[1].signature"),
    ([{"type": "thinking", "thinking": 3, "signature": "s"}], "messages[1].thinking_blocks[0].thinking"),
    ([{"type": "redacted_thinking", "data": None}], "messages[1].thinking_blocks[0].data"),
])
def test_bad_thinking_blocks_are_a_400_naming_them(
        client: openai.OpenAI, upstream: ScriptedAnthropic, blocks: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**THINK, messages=[  # type: ignore[misc]
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "thinking_blocks": blocks},
            {"role": "user", "content": "c"}])
    assert refused.value.param == param and upstream.received == []


def test_thinking_blocks_on_a_user_message_are_a_400(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**THINK, messages=[  # type: ignore[misc]
            {"role": "user", "content": "a", "thinking_blocks": [SIGNED]}])
    assert refused.value.param == "messages[0].thinking_blocks" and upstream.received == []
