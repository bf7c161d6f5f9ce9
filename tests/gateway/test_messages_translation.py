"""``POST /v1/messages`` translated for an OpenAI upstream: what chat can carry goes (system blocks and
tool-result texts one per line, is_error told in the text, disable_parallel_tool_use as
parallel_tool_calls: false), what it cannot is a 400 naming the field before the upstream is asked;
empty content is refused as Anthropic refuses it; routing errors under /v1/messages take Anthropic's
shape; answers keep Anthropic's event order and stop reasons whatever order and finish the upstream's
chunks come in. The anthropic SDK (or raw HTTP) against a gateway in front of the fake OpenAI upstream."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import msgspec
import pytest

from gateway.dialects.anthropic_request import MessagesRequest, as_sent, to_chat_request
from gateway.errors import ApiError
from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault, chat_answer, chat_chunks


@pytest.fixture
def client(env: GatewayEnv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.server.url, api_key=ADMIN_KEY, max_retries=0)


def _post(env: GatewayEnv, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(env.server.url + path, json={"model": "echo", "max_tokens": 8} | body,
                      headers={"x-api-key": ADMIN_KEY}, timeout=10)


def test_tool_round_trip_keeps_separators_errors_and_parallelism(client: anthropic.Anthropic,
                                                                  upstream: FakeUpstream) -> None:
    client.messages.create(
        model="echo", max_tokens=16,
        system=[{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}],
        tools=[{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                 "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "fine"}]},
                {"type": "text", "text": "and?"}]},
        ])
    sent = upstream.last.json
    assert sent["messages"][0] == {"role": "system", "content": "S1\nS2"}
    assert sent["messages"][3] == {"role": "tool", "content": "[tool error] r1\nr2", "tool_call_id": "t1"}
    assert sent["messages"][4] == {"role": "tool", "content": "fine", "tool_call_id": "t2"}
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False


UNTRANSLATABLE: list[tuple[dict[str, Any], str]] = [
    ({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]},
     "messages[0].content[0].source.type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f1"}}]}]},
     "messages[0].content[0].source.type"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "web_search_20250305", "name": "web"}]},
     "tools[0].type"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"messages": [{"role": "user", "content": [{"type": "search_result", "source": "s", "title": "t",
                                                  "content": [{"type": "text", "text": "abc"}]}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}]},
     "messages[0].content[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text"}]}]}]}, "messages[0].content[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text"}}]}]},
     "messages[0].content[0].source.data"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": [{"name": "f", "input_schema": {}}],
      "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"messages": [{"role": "user", "content": "q"}],
      "mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "m"}]}, "mcp_servers"),
    ({"messages": [{"role": "user", "content": "q"}], "container": "container_1"}, "container"),
    ({"messages": [{"role": "user", "content": "q"}], "service_tier": "standard_only"}, "service_tier"),
    ({"messages": [{"role": "user", "content": "q"}], "stop_sequence": ["END"]}, "stop_sequence"),  # a typo
    # nested fields chat has no place for are named too, not dropped
    ({"messages": [{"role": "user", "content": "q", "name": "bob"}]}, "messages[0].name"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "q", "citations": [
        {"type": "char_location", "cited_text": "q", "document_index": 0, "start_char_index": 0,
         "end_char_index": 1}]}]}]}, "messages[0].content[0].citations"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://x/a.png", "detail": "low"}}]}]}, "messages[0].content[0].source.detail"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "r", "citations": []}]}]}]}, "messages[0].content[0].content[0].citations"),
    ({"messages": [{"role": "user", "content": "q"}], "system": [{"type": "text", "text": "s", "frob": 1}]},
     "system[0].frob"),
    ({"messages": [{"role": "user", "content": "q"}],
      "tools": [{"name": "f", "input_schema": {"type": "object"}, "input_examples": [{"x": 1}]}]},
     "tools[0].input_examples"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": [{"name": "f", "input_schema": {}}],
      "tool_choice": {"type": "auto", "frob": True}}, "tool_choice.frob"),
    ({"messages": [{"role": "user", "content": "q"}], "metadata": {"user_id": "u", "session": "s"}},
     "metadata.session"),
]


@pytest.mark.parametrize(("body", "field"), UNTRANSLATABLE)
def test_what_chat_cannot_carry_is_a_400_naming_it(env: GatewayEnv, upstream: FakeUpstream,
                                                   body: dict[str, Any], field: str) -> None:
    response = _post(env, body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(field + ": ")
    assert upstream.received == []


def test_an_unknown_field_set_to_null_changes_nothing(env: GatewayEnv, upstream: FakeUpstream) -> None:
    response = _post(env, {"messages": [{"role": "user", "content": "q"}], "container": None})
    assert response.status_code == 200, response.text
    assert "container" not in upstream.last.json


def test_nested_fields_set_to_null_or_known_change_nothing(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """A null asks for nothing at any depth (a block sent back as an SDK gave it: ``citations: null``;
    ``cache_control`` and a tool's ``type``, which Anthropic's schema lets be null); a client tool's
    own ``type: custom``, ``cache_control`` and ``eager_input_streaming`` (a delivery hint) are
    Anthropic's fields the gateway knows."""
    response = _post(env, {
        "system": [{"type": "text", "text": "s", "cache_control": None}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "q", "citations": None,
                                                   "cache_control": {"type": "ephemeral"}},
                                                  {"type": "text", "text": "r", "cache_control": None}], "name": None}],
        "tools": [{"type": "custom", "name": "f", "input_schema": {"type": "object"}, "input_examples": None,
                   "cache_control": {"type": "ephemeral"}, "eager_input_streaming": True},
                  {"type": None, "name": "g", "input_schema": {"type": "object"}, "cache_control": None}],
        "tool_choice": {"type": "auto", "frob": None}, "metadata": {"user_id": "u", "session": None}})
    assert response.status_code == 200, response.text
    sent = upstream.last.json
    assert sent["messages"][1]["content"] == [{"type": "text", "text": "q"}, {"type": "text", "text": "r"}]
    assert [t["function"]["name"] for t in sent["tools"]] == ["f", "g"] and sent["user"] == "u"
    assert "eager_input_streaming" not in json.dumps(sent["tools"])  # a hint for Anthropic alone


def test_whole_and_streamed_answers_agree(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """An upstream's reasoning is a thinking block in both; the prompt's cached tokens are
    ``cache_read_input_tokens``, apart from ``input_tokens`` (Anthropic's usage), in both."""
    upstream.rich = True  # reasoning_content, and usage with 2 of 9 prompt tokens cached
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.usage.input_tokens == 7 and message.usage.cache_read_input_tokens == 2
        assert message.usage.output_tokens == 4
    assert whole.content[0].thinking == "thought about it" and streamed.content[0].thinking == "thought"
    assert whole.content[1].text == streamed.content[1].text == "hi"


def test_an_answers_thinking_blocks_keep_their_signatures(client: anthropic.Anthropic,
                                                         upstream: FakeUpstream) -> None:
    """A chat upstream that gives Anthropic's blocks as LiteLLM does (``thinking_blocks``, beside
    ``reasoning_content``): the whole answer's thinking is those blocks, signatures included."""
    blocks = [{"type": "redacted_thinking", "data": "xyz"}, {"type": "thinking", "thinking": "hm", "signature": "s1"}]
    upstream.fail_next(Fault(status=200, body={"id": "chatcmpl-1", "created": 1, "model": "m",
                                               "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "reasoning_content": "hm", "thinking_blocks": blocks, "content": "hi"}}]}))
    message = client.messages.create(model="echo", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert [b.model_dump(exclude_none=True) for b in message.content] == [*blocks, {"type": "text", "text": "hi"}]


def test_reasoning_under_either_name_is_a_thinking_block(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """Newer vLLM and OpenRouter name a chat answer's reasoning ``reasoning`` (not ``reasoning_content``):
    it is the thinking block all the same, whole and streamed."""
    envelope = {"id": "chatcmpl-1", "created": 1, "model": "m"}
    chunks = [{"delta": {"role": "assistant", "reasoning": "thought"}}, {"delta": {"reasoning": " hard"}},
              {"delta": {"content": "hi"}}, {"delta": {}, "finish_reason": "stop"}]
    upstream.fail_next(
        Fault(status=200, body=envelope | {"object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "reasoning": "thought hard", "content": "hi"}}]}),
        Fault(status=200, headers={"content-type": "text/event-stream"}, body=b"".join(
            b"data: " + msgspec.json.encode(envelope | {"object": "chat.completion.chunk",
                                                        "choices": [{"index": 0} | c]}) + b"\n\n"
            for c in chunks) + b"data: [DONE]\n\n"))
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == "thought hard"  # type: ignore[union-attr]


def test_interleaved_parallel_calls_stream_as_whole_blocks(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """Chat may interleave parallel calls' argument deltas; Anthropic's stream has each block whole
    between its start and stop (no delta for a stopped block), in the order the calls began."""
    envelope = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    calls = [[{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}],
             [{"index": 0, "function": {"arguments": '{"a":'}}],
             [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": '{"b":'}}],
             [{"index": 0, "function": {"arguments": "1}"}}], [{"index": 1, "function": {"arguments": "2}"}}]]
    chunks = [{"delta": {"role": "assistant", "content": "Let me look."}},
              *({"delta": {"tool_calls": c}} for c in calls), {"delta": {}, "finish_reason": "tool_calls"}]
    upstream.fail_next(Fault(status=200, headers={"content-type": "text/event-stream"}, body=b"".join(
        b"data: " + msgspec.json.encode(envelope | {"choices": [{"index": 0} | c]}) + b"\n\n" for c in chunks)
        + b"data: [DONE]\n\n"))
    events = list(client.messages.create(model="echo", max_tokens=8, stream=True, tools=[
        {"name": n, "input_schema": {"type": "object"}} for n in "fg"], messages=[{"role": "user", "content": "q"}]))
    blocks = [(e.type, e.index) for e in events if e.type.startswith("content_block")]  # type: ignore[union-attr]
    assert [b for i, b in enumerate(blocks) if i == 0 or b != blocks[i - 1]] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2)]
    arguments = [[e.delta.partial_json for e in events  # type: ignore[union-attr]
                  if e.type == "content_block_delta" and e.index == i] for i in (1, 2)]
    assert arguments == [['{"a":', "1}"], ['{"b":', "2}"]]


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": []}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": []}, {"role": "user", "content": "r"}],
    [{"role": "user", "content": ""}],
])
def test_empty_content_is_refused(env: GatewayEnv, upstream: FakeUpstream, messages: list[Any]) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = _post(env, {"messages": messages}, path)
        assert response.status_code == 400, response.text
        assert response.json()["type"] == "error"
        assert "content" in response.json()["error"]["message"]
    assert upstream.received == []


def test_a_final_assistant_message_may_be_empty(env: GatewayEnv, upstream: FakeUpstream) -> None:
    response = _post(env, {"messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": []}]})
    assert response.status_code == 200, response.text
    assert upstream.last.json["messages"] == [{"role": "user", "content": "a b"}]


def test_empty_content_is_refused_for_every_deployment() -> None:
    """The engine, and an Anthropic deployment, get the same 400 (the check precedes any translation)."""
    body = msgspec.convert({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": []}]},
                           MessagesRequest)
    for translate in (to_chat_request, lambda r: as_sent(r, {})):
        with pytest.raises(ApiError) as refused:
            translate(body)
        assert refused.value.status == 400 and refused.value.param == "messages[0].content"


def test_routing_errors_under_messages_take_anthropic_shape(env: GatewayEnv) -> None:
    with httpx.Client(base_url=env.server.url, headers={"x-api-key": ADMIN_KEY}, timeout=10) as http:
        wrong_method = http.get("/v1/messages")
        assert wrong_method.status_code == 405
        assert wrong_method.json()["type"] == "error"
        assert wrong_method.json()["error"]["type"] == "invalid_request_error"
        assert "allow" in wrong_method.headers
        unknown = http.post("/v1/messages/nope", json={})
        assert unknown.status_code == 404
        assert unknown.json() == {"type": "error", "error": {
            "type": "not_found_error", "message": "Invalid URL (POST /v1/messages/nope)"}}
        unsupported = http.post("/v1/messages", content=b"{}", headers={"content-encoding": "br"})
        assert unsupported.status_code == 415  # any 4xx Anthropic names no type for: invalid_request_error
        assert unsupported.json()["error"]["type"] == "invalid_request_error"
        elsewhere = http.post("/v1/nope", json={})  # OpenAI's shape everywhere else
        assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "unknown_url"


def test_a_prefill_is_continued_not_answered_in_a_new_turn(client: anthropic.Anthropic,
                                                           upstream: FakeUpstream) -> None:
    """A final assistant message is the start of the answer (Anthropic's prefill): it goes last, with
    vLLM's continue_final_message (and no generation prompt), and the answer is what follows it, as
    Anthropic's holds only what the model added."""
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "a b"},
                                                               {"role": "assistant", "content": "{"}]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for sent in (upstream.received[-2].json, upstream.last.json):
        assert sent["messages"][-1] == {"role": "assistant", "content": "{"}
        assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert whole.content[0].text == streamed.content[0].text == "a b"  # type: ignore[union-attr]


def test_a_provider_that_cannot_continue_a_prefill_is_a_400_naming_the_message(
        client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """OpenAI's own API refuses vLLM's continue_final_message (param null, the field in its message):
    the client is told its prefill cannot be continued, not of a field it never sent."""
    refusal = {"error": {"message": "Unrecognized request argument supplied: continue_final_message",
                         "type": "invalid_request_error", "param": None, "code": None}}
    upstream.fail_next(Fault(status=400, body=refusal))
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="echo", max_tokens=8, messages=[{"role": "user", "content": "a b"},
                                                                     {"role": "assistant", "content": "{"}])
    message = err.value.body["error"]["message"]  # type: ignore[index]
    assert message.startswith("messages[1]: this model cannot continue a final assistant message"), message


def test_an_empty_final_assistant_message_is_no_prefill(env: GatewayEnv, upstream: FakeUpstream) -> None:
    for empty in ("", [], [{"type": "text", "text": ""}]):
        messages = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": empty}]
        response = _post(env, {"messages": messages})
        assert response.status_code == 200, response.text
        assert upstream.last.json["messages"] == [{"role": "user", "content": "a b"}]
        assert "continue_final_message" not in upstream.last.json


@pytest.mark.parametrize("prefill", ["{ ", "\n", [{"type": "text", "text": "a"}, {"type": "text", "text": "b\t"}]])
def test_a_prefill_ending_in_whitespace_is_refused_as_anthropic_refuses_it(
        client: anthropic.Anthropic, upstream: FakeUpstream, prefill: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="echo", max_tokens=8, messages=[
            {"role": "user", "content": "a b"}, {"role": "assistant", "content": prefill}])
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert err.value.body["error"]["message"] == (  # type: ignore[index]
        "messages[1].content: final assistant content cannot end with trailing whitespace")
    assert upstream.received == []


def test_usage_the_upstream_did_not_report_is_what_was_metered(client: anthropic.Anthropic, upstream: FakeUpstream,
                                                              env: GatewayEnv) -> None:
    """As a stream's: the whole answer reports the tokens billed (estimated), not zeros."""
    upstream.options.report_usage = False
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "a b c"}]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    billed = [(r.prompt_tokens, r.completion_tokens) for r in env.usage.wait_for(2)]
    assert billed[0] == billed[1] and billed[0][1] == 3
    for message in (whole, streamed):
        assert (message.usage.input_tokens, message.usage.output_tokens) == billed[0]


def test_a_strict_tool_stays_strict_for_a_chat_upstream(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """Anthropic's ``strict`` on a tool is OpenAI's ``function.strict``: the schema stays enforced."""
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    client.messages.create(model="echo", max_tokens=8, messages=[{"role": "user", "content": "q"}], tools=[
        {"name": "f", "input_schema": schema, "strict": True}, {"name": "g", "input_schema": schema, "strict": False},
        {"name": "h", "input_schema": schema}])
    functions = [tool["function"] for tool in upstream.last.json["tools"]]
    assert [f.get("strict") for f in functions] == [True, False, None]
    assert functions[0] == {"name": "f", "parameters": schema, "strict": True}


def _in_order(events: list[Any]) -> list[tuple[str, int]]:
    """The content block events of an Anthropic stream, checked against its contract: message_start
    first; each block's start, deltas and stop together, indices counting up from 0; message_delta,
    then message_stop, last. Returns (type, index) of each block event, runs of deltas as one."""
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    blocks = [(e.type, e.index) for e in events[1:-2]]
    expected = -1
    for kind, index in blocks:
        if kind == "content_block_start":
            expected += 1
        assert index == expected, blocks
    starts = [i for k, i in blocks if k == "content_block_start"]
    stops = [i for k, i in blocks if k == "content_block_stop"]
    assert starts == stops == list(range(len(starts))), blocks
    return [b for i, b in enumerate(blocks) if i == 0 or b != blocks[i - 1]]


def test_text_amid_a_calls_arguments_comes_after_its_block(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """Text (or reasoning) an upstream sends while a call's arguments are partial JSON waits until
    the call's block is whole: no delta for a block already stopped. Empty, null and role-only
    deltas open no block."""
    first = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f"}}  # no arguments yet
    upstream.fail_next(chat_chunks(
        {"delta": {"role": "assistant"}}, {"delta": {"content": None}}, {"delta": {"content": ""}},
        {"delta": {"tool_calls": [first]}},
        {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}},
        {"delta": {"content": "\n"}}, {"delta": {"reasoning_content": "hm"}},
        {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}},
        {"delta": {}, "finish_reason": "tool_calls"}))
    events = list(client.messages.create(model="echo", max_tokens=8, stream=True, tools=[
        {"name": "f", "input_schema": {"type": "object"}}], messages=[{"role": "user", "content": "q"}]))
    assert _in_order(events) == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2)]
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == [  # type: ignore[union-attr]
        "tool_use", "text", "thinking"]
    assert [e.delta.partial_json for e in events  # type: ignore[union-attr]
            if e.type == "content_block_delta" and e.index == 0] == ['{"a":', "1}"]


def test_a_call_finished_as_stop_is_tool_use(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """vLLM finishes a call it was made to make (a named tool_choice, ``required``) as ``stop``, not
    ``tool_calls``: the answer holds tool_use blocks, so its stop_reason is ``tool_use`` (what an
    agent loop reads to run the tools), whole and streamed; a matched stop string stays ``stop_sequence``."""
    call = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    upstream.fail_next(chat_answer({"role": "assistant", "content": None, "tool_calls": [call]}, "stop"),
                       chat_chunks({"delta": {"role": "assistant", "tool_calls": [call | {"index": 0}]}},
                                   {"delta": {}, "finish_reason": "stop"}))
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}],
               "tools": [{"name": "f", "input_schema": {"type": "object"}}],
               "tool_choice": {"type": "tool", "name": "f"}}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert message.stop_reason == "tool_use" and message.stop_sequence is None
        assert [(b.type, b.input) for b in message.content] == [("tool_use", {"a": 1})]  # type: ignore[union-attr]
    upstream.fail_next(chat_answer({"role": "assistant", "content": "x", "tool_calls": [call]}, "stop",
                                   stop_reason="END"))
    cut = client.messages.create(**kw, stop_sequences=["END"])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "END")


def test_continuation_chunks_may_null_a_calls_id_type_and_name(client: anthropic.Anthropic, env: GatewayEnv,
                                                                upstream: FakeUpstream) -> None:
    """OpenAI's chunk schema lets a call's later deltas carry ``id``, ``type`` and ``name`` as null
    (only the first names them), as some OpenAI-compatible servers send them: the call is the one the
    first delta named, in a translated stream and in a relayed chat stream alike."""
    chunks = ({"delta": {"role": "assistant", "content": None, "tool_calls": [
                  {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": None}}]}},
              {"delta": {"content": None, "tool_calls": [
                  {"index": 0, "id": None, "type": None, "function": {"name": None, "arguments": '{"a": 1}'}}]}},
              {"delta": {}, "finish_reason": "tool_calls"})
    upstream.fail_next(chat_chunks(*chunks), chat_chunks(*chunks))
    with client.messages.stream(model="echo", max_tokens=8, messages=[{"role": "user", "content": "q"}],
                                tools=[{"name": "f", "input_schema": {"type": "object"}}]) as stream:
        message = stream.get_final_message()
    assert [(b.type, b.id, b.name, b.input) for b in message.content] == [  # type: ignore[union-attr]
        ("tool_use", "call_a", "f", {"a": 1})]
    relayed = httpx.post(env.server.url + "/v1/chat/completions", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                         json={"model": "echo", "stream": True, "messages": [{"role": "user", "content": "q"}]})
    assert relayed.status_code == 200 and '"error"' not in relayed.text, relayed.text


def test_an_answer_without_a_choice_is_an_empty_message(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """A whole answer with no choice (``choices: []``) is a message with no content, as a stream of no
    choice is (not a 500)."""
    upstream.fail_next(Fault(status=200, body={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                               "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0}}),
                       chat_chunks(usage={"prompt_tokens": 3, "completion_tokens": 0}))
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert (message.content, message.stop_reason, message.usage.input_tokens) == ([], "end_turn", 3)


def test_a_refusal_is_told_in_text(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """An OpenAI model's ``refusal`` (its explanation in place of content) is the answer's text, whole
    and streamed, not dropped to leave an empty message."""
    upstream.fail_next(chat_answer({"role": "assistant", "content": None, "refusal": "I can't help."}, "stop"),
                       chat_chunks({"delta": {"role": "assistant", "refusal": "I can't"}},
                                   {"delta": {"refusal": " help."}}, {"delta": {}, "finish_reason": "stop"}))
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert [(b.type, b.text) for b in message.content] == [("text", "I can't help.")]  # type: ignore[union-attr]


def test_sglangs_matched_stop_is_the_stop_sequence(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    """SGLang names the stop string that matched ``matched_stop`` (vLLM: ``stop_reason``): it is the
    answer's ``stop_sequence`` all the same, whole and streamed; a matched token id (an int) is no
    stop sequence."""
    upstream.fail_next(chat_answer({"role": "assistant", "content": "x"}, "stop", matched_stop="END"),
                       chat_chunks({"delta": {"role": "assistant", "content": "x"}},
                                   {"delta": {}, "finish_reason": "stop", "matched_stop": "END"}),
                       chat_answer({"role": "assistant", "content": "x"}, "stop", matched_stop=128009))
    kw: Any = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}],
               "stop_sequences": ["END"]}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    eos = client.messages.create(**kw)
    assert (eos.stop_reason, eos.stop_sequence) == ("end_turn", None)
