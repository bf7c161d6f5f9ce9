"""``include: ["reasoning.encrypted_content"]`` on ``/v1/responses`` translated to chat, as OpenAI's
Codex CLI uses it (``store: false``, each turn's output items sent back as the next turn's input),
with the official openai SDK as the client and a scripted chat upstream streaming reasoning."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from gateway.dialects.responses_reasoning import (
    decoded_blocks,
    decoded_reasoning,
    encrypted_reasoning,
    joined_blocks,
)
from gateway.dialects.responses_request import ResponsesRequest, listed, sent_items
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, chat_answer, chat_chunks

ENCRYPTED = "reasoning.encrypted_content"
TOOL = {"type": "function", "name": "shell", "description": "Runs a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": False}
USAGE = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
# the fields Codex sends with every turn
CODEX: dict[str, Any] = {"instructions": "You are Codex.", "tools": [TOOL], "tool_choice": "auto",
                         "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
                         "store": False, "include": [ENCRYPTED], "prompt_cache_key": "session-1"}
CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":"ls"}'}}


@pytest.fixture
def client(env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)


def _streamed_turn(upstream: FakeUpstream) -> None:
    upstream.fail_next(chat_chunks({"delta": {"role": "assistant", "reasoning_content": "think"}},
                                   {"delta": {"reasoning_content": " hard"}}, {"delta": {"content": "Let me look."}},
                                   {"delta": {"tool_calls": [CALL]}}, {"delta": {}, "finish_reason": "tool_calls"},
                                   usage=USAGE))


def _as_codex_sends(output: list[Any]) -> list[dict[str, Any]]:
    """Output items as Codex sends them back: no ids, and a reasoning item without its reasoning text."""
    items = []
    for item in output:
        sent = {k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "status")}
        if sent["type"] == "reasoning":
            sent.pop("content", None)
        items.append(sent)
    return items


NEXT_TURN = [{"role": "system", "content": "You are Codex."}, {"role": "user", "content": "list the files"},
             {"role": "assistant", "content": "Let me look.", "tool_calls": [
                 {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":"ls"}'}}]},
             {"role": "tool", "content": "a.txt", "tool_call_id": "call_1"}]


def test_a_codex_turn_streams_reasoning_with_encrypted_content(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """The reasoning item carries ``encrypted_content`` (the gateway's encoding of its text) where
    it is done and in ``response.completed``; the next turn, sending every output item back with a
    function call's output, is served, the reasoning left out of what chat gets."""
    _streamed_turn(upstream)
    with client.responses.stream(model="echo", input=[{"role": "user", "content": "list the files"}],
                                 **CODEX) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[-1].type == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.type for item in done] == ["reasoning", "message", "function_call"]
    blob = done[0].encrypted_content  # type: ignore[union-attr]
    assert isinstance(blob, str) and "think hard" not in blob
    assert decoded_reasoning(blob) == "think hard"
    for response in (final, events[-1].response):  # type: ignore[union-attr]
        assert response.output[0].encrypted_content == blob  # type: ignore[union-attr]
        assert response.output[0].content[0].text == "think hard"  # type: ignore[union-attr,index]
    assert upstream.last.json["messages"][0] == {"role": "system", "content": "You are Codex."}

    upstream.fail_next(chat_chunks({"delta": {"role": "assistant", "content": "Found a.txt."}},
                                   {"delta": {}, "finish_reason": "stop"}, usage=USAGE))
    following = [{"role": "user", "content": "list the files"}, *_as_codex_sends(final.output),
                 {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}]
    with client.responses.stream(model="echo", input=following, **CODEX) as stream:  # type: ignore[arg-type]
        assert stream.get_final_response().output_text == "Found a.txt."
    assert upstream.last.json["messages"] == NEXT_TURN


def test_a_whole_answer_has_encrypted_content_too(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.fail_next(chat_answer({"role": "assistant", "reasoning": "think hard", "content": "Let me look.",
                                    "tool_calls": [{k: v for k, v in CALL.items() if k != "index"}]}, "tool_calls"))
    first = client.responses.create(model="echo", input="list the files", **CODEX)
    assert [item.type for item in first.output] == ["reasoning", "message", "function_call"]
    assert decoded_reasoning(first.output[0].encrypted_content) == "think hard"  # type: ignore[union-attr]
    client.responses.create(model="echo", **CODEX, input=[  # type: ignore[arg-type]
        {"role": "user", "content": "list the files"}, *_as_codex_sends(first.output),
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}])
    assert upstream.last.json["messages"] == NEXT_TURN


def test_without_include_there_is_no_encrypted_content(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.fail_next(chat_answer({"role": "assistant", "reasoning_content": "think", "content": "hi"}, "stop"))
    _streamed_turn(upstream)
    whole = client.responses.create(model="echo", input="x")
    with client.responses.stream(model="echo", input="x", tools=[TOOL]) as stream:  # type: ignore[list-item]
        streamed = stream.get_final_response()
    for response in (whole, streamed):
        assert response.output[0].type == "reasoning"
        assert "encrypted_content" not in response.output[0].model_dump(exclude_unset=True)


FOREIGN = ["gAAAAABo" + "x" * 40,  # as OpenAI's own models give it
           "swy1.!!!not-base64", "swy1.bm90IGpzb24", "swy1.eyJ0ZXh0IjogMX0", "swy1.WzFd", "", None, 7,
           {"nested": True}]


@pytest.mark.parametrize("stream", [False, True])
def test_encrypted_content_not_of_ours_is_accepted_and_dropped(client: openai.OpenAI, upstream: FakeUpstream,
                                                               stream: bool) -> None:
    """Another provider's blob, or a malformed one, cannot be read back: the item is accepted and
    dropped, as reasoning is (chat has no field for it), never an error."""
    if stream:
        upstream.fail_next(chat_chunks({"delta": {"role": "assistant", "content": "ok"}},
                                       {"delta": {}, "finish_reason": "stop"}, usage=USAGE))
    reasoning = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}], "encrypted_content": blob}
                 for blob in FOREIGN]
    r = httpx.post(f"{client.base_url}responses", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, json={
        "model": "echo", "stream": stream, "include": [ENCRYPTED], "store": False,
        "input": [{"role": "user", "content": "x"}, *reasoning, {"role": "user", "content": "y"}]})
    assert r.status_code == 200, r.text
    assert upstream.last.json["messages"] == [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]


def test_other_include_values_are_a_400_naming_include(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    for include in (["message.output_text.logprobs"], [ENCRYPTED, "file_search_call.results"], ENCRYPTED):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="echo", input="x", include=include)  # type: ignore[arg-type]
        assert err.value.body["param"] == "include", include  # type: ignore[index]


def test_reasoning_sent_back_is_listed_with_its_text_restored() -> None:
    """A reasoning item of the gateway's own sent back without its text (as Codex sends it) is kept
    among the input items with the text restored, under an id that marks it as the gateway's."""
    ours = {"type": "reasoning", "summary": [], "encrypted_content": encrypted_reasoning("think hard")}
    foreign = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABoxx"}
    req = ResponsesRequest(model="m", input=[ours, foreign])
    restored, kept = listed(sent_items(req))
    assert restored["content"] == [{"type": "reasoning_text", "text": "think hard"}]
    assert restored["id"].startswith("rs_sy") and restored["encrypted_content"] == ours["encrypted_content"]
    assert "content" not in kept and not kept["id"].startswith("rs_sy")


def test_a_blob_carries_thinking_blocks_exactly_and_an_old_one_reads() -> None:
    """Blocks as the answer gave them (a signature, a redacted block's data, a field the gateway does
    not model), and none from a blob made before blocks were kept (text alone)."""
    blocks = [{"type": "redacted_thinking", "data": "EmwK", "cache_control": {"type": "ephemeral"}},
              {"type": "thinking", "thinking": "hmm", "signature": "sig-1"}]
    blob = encrypted_reasoning("hmm", blocks)
    assert decoded_blocks(blob) == blocks and decoded_reasoning(blob) == "hmm"
    old = encrypted_reasoning("think hard")
    assert old == "swy1.eyJ0ZXh0IjoidGhpbmsgaGFyZCJ9"  # the text-only form, unchanged
    assert decoded_reasoning(old) == "think hard" and decoded_blocks(old) is None
    assert all(decoded_blocks(foreign) is None for foreign in FOREIGN)


def test_a_streams_thinking_pieces_join_into_the_answers_blocks() -> None:
    """As ``backends.anthropic_thinking`` streams them: text pieces until the signature; a redacted block whole."""
    blocks: list[dict[str, Any]] = []
    joined_blocks(blocks, [{"type": "redacted_thinking", "data": "EmwK"},
                           {"type": "thinking", "thinking": "let me ", "signature": ""},
                           {"type": "thinking", "thinking": "think", "signature": ""},
                           {"type": "thinking", "thinking": "", "signature": "sig-1"},
                           {"type": "thinking", "thinking": "again", "signature": ""},
                           {"type": "thinking", "thinking": "", "signature": "sig-2"}])
    assert blocks == [{"type": "redacted_thinking", "data": "EmwK"},
                      {"type": "thinking", "thinking": "let me think", "signature": "sig-1"},
                      {"type": "thinking", "thinking": "again", "signature": "sig-2"}]
