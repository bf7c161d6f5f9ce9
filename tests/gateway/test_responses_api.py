"""``POST /v1/responses`` with the official openai SDK as the client, translated via chat to an
OpenAI upstream (the loopback echo upstream)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault


@pytest.fixture
def client(env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)


def test_response_round_trip(client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv) -> None:
    response = client.responses.create(model="echo", input="hello from responses", instructions="be brief",
                                       max_output_tokens=64, temperature=0.2)
    assert response.object == "response" and response.status == "completed"
    assert response.output_text == "hello from responses"
    assert response.output[0].type == "message"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.usage.total_tokens == response.usage.input_tokens + 3
    sent = upstream.last.json
    assert sent["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hello from responses"}]
    # chat's max_tokens is refused by OpenAI's reasoning models: the limit goes as max_completion_tokens
    assert sent["max_completion_tokens"] == 64 and "max_tokens" not in sent and sent["temperature"] == 0.2
    assert env.usage.wait_for(1)[0].endpoint == "responses"


def test_response_stream(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="echo", input="streamed words here", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_item.added" in kinds and "response.content_part.added" in kinds
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "streamed words here"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "streamed words here"
    assert final.usage is not None and final.usage.output_tokens == 3


def test_function_call_round_trip(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    tools = [{"type": "function", "name": "lookup", "description": "d",
              "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}]
    upstream.fail_next(Fault(status=200, body={
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "upstream-echo",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q":1}'}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}))
    first = client.responses.create(model="echo", input="find it", tools=tools)  # type: ignore[arg-type]
    call = first.output[0]
    assert call.type == "function_call" and call.name == "lookup" and call.arguments == '{"q":1}'
    assert call.call_id == "call_1"
    assert upstream.last.json["tools"][0]["function"]["name"] == "lookup"

    second = client.responses.create(model="echo", tools=tools, input=[  # type: ignore[arg-type]
        {"role": "user", "content": "find it"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
    ])
    sent = upstream.last.json
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q":1}'}
    assert sent["messages"][2] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    assert second.status == "completed"


def test_text_format_becomes_response_format(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    client.responses.create(model="echo", input="x", text={"format": {  # type: ignore[arg-type]
        "type": "json_schema", "name": "thing", "schema": schema, "strict": True}})
    assert upstream.last.json["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "echo", "input": ""}, "input"),
    ({"model": "echo", "input": []}, "input"),
    ({"model": "echo", "input": [{"type": "bogus", "x": 1}]}, "input"),
    ({"model": "echo", "input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.name"),
])
def test_bad_input_names_the_field(env: GatewayEnv, body: dict[str, object], param: str) -> None:
    r = httpx.post(env.base_url + "/responses", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param)


def _post(env: GatewayEnv, body: dict[str, object]) -> httpx.Response:
    return httpx.post(env.base_url + "/responses", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"})


# ---------------------------------------------------------------- every field mapped to chat, or a 400 naming it

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


def test_text_verbosity_and_strict_tools_are_mapped(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    schema = {"type": "object", "properties": {}}
    client.responses.create(model="echo", input="x", tools=[  # type: ignore[list-item]
                                TOOL | {"strict": True, "defer_loading": False, "output_schema": None}],
                            text={"verbosity": "low", "format": {  # type: ignore[typeddict-unknown-key]
                                "type": "json_schema", "name": "n", "schema": schema, "description": "d"}})
    sent = upstream.last.json
    assert sent["verbosity"] == "low"
    assert sent["tools"][0]["function"] == {"name": "f", "parameters": TOOL["parameters"], "strict": True}
    assert sent["response_format"]["json_schema"] == {"name": "n", "schema": schema, "description": "d"}


def test_tool_choices_chat_can_express_are_mapped(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    client.responses.create(model="echo", input="x", tools=[TOOL], tool_choice={  # type: ignore[list-item]
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]})
    assert upstream.last.json["tool_choice"] == {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}}
    client.responses.create(model="echo", input="x", tools=[TOOL],  # type: ignore[list-item]
                            tool_choice={"type": "function", "name": "f"})
    assert upstream.last.json["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    client.responses.create(model="echo", input="x", tools=[TOOL], tool_choice="required")  # type: ignore[list-item]
    assert upstream.last.json["tool_choice"] == "required"


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp", "server_label": "s"}]}},
     "tool_choice.tools[0].type"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "sometimes", "tools": [{"type": "function", "name": "f"}]}},
     "tool_choice.mode"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"text": {"brand_new": 1}}, "text.brand_new"),
    ({"tools": [TOOL | {"brand_new": 1}]}, "tools[0].brand_new"),
    ({"tools": [TOOL | {"defer_loading": True}]}, "tools[0].defer_loading"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"top_logprobs": 3}, "top_logprobs"),  # no log-probabilities come back through chat: not silently nothing
    ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),  # no summaries come back through chat
    ({"reasoning": {"effort": "low", "brand_new": 1}}, "reasoning.brand_new"),
    ({"reasoning": "low"}, "reasoning"),
])
def test_what_chat_cannot_express_is_a_400_naming_it(env: GatewayEnv, upstream: FakeUpstream,
                                                      extra: dict[str, object], param: str) -> None:
    body = {"model": "echo", "input": "x", "tools": [TOOL]} | extra
    r = _post(env, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert not upstream.received  # nothing forwarded


@pytest.mark.parametrize("hosted", [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
                                    {"type": "code_interpreter", "container": {"type": "auto"}}])
def test_a_hosted_tool_is_a_400_naming_it(env: GatewayEnv, upstream: FakeUpstream, hosted: dict[str, object]) -> None:
    """A hosted tool chat cannot serve is a 400 whose message names the tool (not only its index), so a
    client sending several learns which one to drop."""
    r = _post(env, {"model": "echo", "input": "x", "tools": [TOOL, hosted]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("tools[1]", "unsupported_parameter")
    assert repr(hosted["type"]) in error["message"], error["message"]
    assert not upstream.received


@pytest.mark.parametrize(("item", "param"), [
    ({"role": "user", "content": []}, "input[0].content"),
    ({"type": "message", "content": "x"}, "input[0].role"),
    ({"type": "function_call_output", "output": "r"}, "input[0].call_id"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
    ({"role": "user", "content": [{"type": "input_text"}]}, "input[0].content[0].text"),
    ({}, "input[0].type"),
    ({"content": "x"}, "input[0].type"),
    ({"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}, "input[0].content[0].file_id"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "u", "file_id": "f"}]},
     "input[0].content[0].file_id"),
    ({"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]},
     "input[0].content[0].file_url"),
    # a field chat has no place for, in an item or a part, is named, not dropped
    ({"role": "user", "content": "x", "brand_new": 1}, "input[0].brand_new"),
    ({"role": "user", "content": [{"type": "input_text", "text": "x", "brand_new": 1}]},
     "input[0].content[0].brand_new"),
    ({"role": "assistant", "content": [{"type": "output_text", "text": "x", "brand_new": 1}]},
     "input[0].content[0].brand_new"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "brand_new": 1}, "input[0].brand_new"),
    ({"type": "function_call_output", "call_id": "c", "output": "r", "brand_new": 1}, "input[0].brand_new"),
    ({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "r", "brand_new": 1}]},
     "input[0].output[0].brand_new"),
])
def test_a_bad_input_item_names_its_field(env: GatewayEnv, upstream: FakeUpstream, item: dict[str, object],
                                          param: str) -> None:
    r = _post(env, {"model": "echo", "input": [item]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not upstream.received


def test_output_items_sent_back_as_they_came_are_translated(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """An earlier response's output items, sent back as the openai SDK gives them (ids, statuses, an
    assistant message's phase, a text's annotations and logprobs, a reasoning item's content): an
    answer's fields, which ask nothing of the next one, and so do nulls."""
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}],
         "status": "completed"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "phase": "final_answer",
         "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}", "status": "completed",
         "caller": {"type": "direct"}, "namespace": None},
        {"type": "function_call_output", "id": "fco_1", "call_id": "c", "output": "r", "status": "completed"},
        {"role": "user", "content": "next", "brand_new": None}]
    r = _post(env, {"model": "echo", "input": output})
    assert r.status_code == 200, r.text
    assert [m["role"] for m in upstream.last.json["messages"]] == ["assistant", "tool", "user"]


def test_max_output_tokens_is_bounded_like_max_tokens(env: GatewayEnv, upstream: FakeUpstream) -> None:
    r = _post(env, {"model": "echo", "input": "x", "max_output_tokens": 2**40})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens", r.text
    assert not upstream.received


def test_a_providers_error_names_the_responses_field(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    for chat_param, param in (("max_tokens", "max_output_tokens"),
                              ("response_format.json_schema.schema", "text.format.schema"),
                              ("tools[0].function.parameters", "tools[0].parameters"),
                              ("messages[2].content", "input"), ("reasoning_effort", "reasoning.effort")):
        upstream.fail_next(Fault(status=400, body={"error": {
            "message": "bad", "type": "invalid_request_error", "param": chat_param, "code": None}}))
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="echo", input="x", max_output_tokens=5)
        assert err.value.body["param"] == param  # type: ignore[index]


def test_the_response_reports_the_requests_settings(client: openai.OpenAI) -> None:
    settings = {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0.3,
                "top_p": 0.5, "max_output_tokens": 50, "metadata": {"k": "v"}}
    response = client.responses.create(model="echo", input="hi", **settings)  # type: ignore[arg-type]
    events = list(client.responses.create(model="echo", input="hi", stream=True, **settings))  # type: ignore[arg-type]
    for reported in (response, events[0].response, events[-1].response):  # type: ignore[union-attr]
        assert reported.tool_choice == "required" and reported.parallel_tool_calls is False
        assert [t.name for t in reported.tools] == ["f"]  # type: ignore[union-attr]
        assert (reported.temperature, reported.top_p, reported.max_output_tokens) == (0.3, 0.5, 50)
        assert reported.metadata == {"k": "v"}
    plain = client.responses.create(model="echo", input="hi")
    assert (plain.tools, plain.tool_choice, plain.parallel_tool_calls) == ([], "auto", True)
    assert plain.max_output_tokens is None and plain.temperature is None


def test_response_ids_are_the_gateways_own(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """An upstream may reuse completion ids (Ollama's chatcmpl-<0..999>): every response still gets
    an id of its own, the same in every event of its stream."""
    body = {"id": "chatcmpl-123", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    chunk = {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    stream = Fault(status=200, headers={"content-type": "text/event-stream"},
                   body=b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
    upstream.fail_next(Fault(status=200, body=body), Fault(status=200, body=body), stream, stream)
    ids = [client.responses.create(model="echo", input="x").id for _ in range(2)]
    for _ in range(2):
        events = list(client.responses.create(model="echo", input="x", stream=True))
        seen = {e.response.id for e in events if hasattr(e, "response")}  # type: ignore[union-attr]
        assert len(seen) == 1
        ids += seen
    # not the upstream's id (a random id of the gateway's may hold "123" by chance: 3 % of runs failed so)
    assert len(set(ids)) == 4 and all(i.startswith("resp_") and "chatcmpl" not in i for i in ids)


def test_usage_an_upstream_does_not_report_is_the_metered_estimate(client: openai.OpenAI, upstream: FakeUpstream,
                                                                   env: GatewayEnv) -> None:
    """The answer reports the usage that was metered, streamed or not, never zeros."""
    upstream.options.report_usage = False
    response = client.responses.create(model="echo", input="one two three four")
    events = list(client.responses.create(model="echo", input="one two three four", stream=True))
    rows = env.usage.wait_for(2)
    for usage, row in ((response.usage, rows[0]), (events[-1].response.usage, rows[1])):  # type: ignore[union-attr]
        assert usage is not None and row.prompt_tokens > 0
        assert (usage.input_tokens, usage.output_tokens) == (row.prompt_tokens, row.completion_tokens)
        assert usage.total_tokens == row.prompt_tokens + row.completion_tokens


def test_a_filtered_answer_is_incomplete(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """Chat's ``finish_reason: content_filter`` is an incomplete response for ``content_filter``,
    streamed or not."""
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "content_filter",
                         "message": {"role": "assistant", "content": "partial"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": "content_filter"}]}
    stream = Fault(status=200, headers={"content-type": "text/event-stream"},
                   body=b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
    upstream.fail_next(Fault(status=200, body=body), stream)
    response = client.responses.create(model="echo", input="x")
    events = list(client.responses.create(model="echo", input="x", stream=True))
    assert events[-1].type == "response.incomplete"
    for final in (response, events[-1].response):  # type: ignore[union-attr]
        assert final.status == "incomplete" and final.output_text == "partial"
        assert final.incomplete_details is not None and final.incomplete_details.reason == "content_filter"


def test_responses_fields_that_ask_for_nothing_are_accepted(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """A Responses field chat has no twin for is fine where its value asks for nothing (null, or a
    stream not obfuscated: the gateway never obfuscates)."""
    events = list(client.responses.create(model="echo", input="hi there", stream=True, max_tool_calls=None,
                                          stream_options={"include_obfuscation": False}))
    assert events[-1].type == "response.completed"
    sent = upstream.last.json
    assert "max_tool_calls" not in sent and sent["stream_options"] == {"include_usage": True}


def test_reasoning_tokens_are_reported(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """A chat provider's ``completion_tokens_details.reasoning_tokens`` is the response's
    ``output_tokens_details.reasoning_tokens``, streamed or not."""
    usage = {"prompt_tokens": 3, "completion_tokens": 45, "total_tokens": 48,
             "completion_tokens_details": {"reasoning_tokens": 40}}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "usage": usage,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
    chunks = [{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": usage}]
    envelope = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    stream = Fault(status=200, headers={"content-type": "text/event-stream"}, body=b"".join(
        b"data: " + json.dumps(envelope | c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n")
    upstream.fail_next(Fault(status=200, body=body), stream)
    response = client.responses.create(model="echo", input="x")
    events = list(client.responses.create(model="echo", input="x", stream=True))
    for final in (response, events[-1].response):  # type: ignore[union-attr]
        assert final.usage is not None and final.usage.output_tokens == 45
        assert final.usage.output_tokens_details.reasoning_tokens == 40


def test_images_and_files_in_the_input_become_chat_parts(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """input_image and input_file parts go to chat as image_url and file parts, beside the text."""
    image = "data:image/png;base64,iVBORw0KGgo="
    client.responses.create(model="echo", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"},
        {"type": "input_image", "image_url": image, "detail": "low"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
        {"type": "input_image", "image_url": "https://example.com/b.png"}]}])
    assert upstream.last.json["messages"][-1]["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": image, "detail": "low"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}}]


# ---------------------------------------------------------------- function outputs, metadata, answers cut short


def _called(output: object) -> list[dict[str, object]]:
    return [{"role": "user", "content": "find it"},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": output}]


def test_a_function_output_of_text_parts_is_the_tool_messages_text(client: openai.OpenAI,
                                                                   upstream: FakeUpstream) -> None:
    """A ``function_call_output`` may hold a list of parts: its text parts are the chat tool
    message's content, one per line (chat's tool message holds text only)."""
    client.responses.create(model="echo", input=_called([  # type: ignore[arg-type]
        {"type": "input_text", "text": "first"}, {"type": "input_text", "text": "second"}]))
    assert upstream.last.json["messages"][2] == {"role": "tool", "content": "first\nsecond", "tool_call_id": "call_1"}


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "input_image", "image_url": "https://example.com/a.png"}, "input[2].output[1]"),
    ({"type": "input_file", "file_id": "file-1"}, "input[2].output[1]"),
    ({"type": "input_text"}, "input[2].output[1].text"),
    ({"type": "refusal", "refusal": "no"}, "input[2].output[1].type"),
])
def test_a_function_output_part_chat_cannot_carry_is_a_400_naming_it(env: GatewayEnv, upstream: FakeUpstream,
                                                                     part: dict[str, object], param: str) -> None:
    r = _post(env, {"model": "echo", "input": _called([{"type": "input_text", "text": "see"}, part])})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert not upstream.received


def test_metadata_is_echoed_and_not_sent_to_chat(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """``metadata`` belongs to the response object: chat providers refuse it (OpenAI's without
    ``store``, Anthropic's beyond ``user_id``), so it is reported back, never forwarded."""
    metadata = {f"k{i}": "v" * 512 for i in range(15)} | {"k" * 64: ""}
    response = client.responses.create(model="echo", input="hi", metadata=metadata)
    assert "metadata" not in upstream.last.json
    events = list(client.responses.create(model="echo", input="hi", stream=True, metadata=metadata))
    assert "metadata" not in upstream.last.json
    for reported in (response, events[0].response, events[-1].response):  # type: ignore[union-attr]
        assert reported.metadata == metadata


def test_end_user_and_cache_key_are_sent_to_chat_and_echoed(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """``safety_identifier`` and ``prompt_cache_key`` go to chat under the same names and, as the
    Responses API's own response object does, are reported back on it, streamed or not."""
    sent = {"safety_identifier": "user-7", "prompt_cache_key": "conv-1"}
    response = client.responses.create(model="echo", input="hi", **sent)  # type: ignore[arg-type]
    assert {k: upstream.last.json[k] for k in sent} == sent
    events = list(client.responses.create(model="echo", input="hi", stream=True, **sent))  # type: ignore[arg-type]
    for reported in (response, events[0].response, events[-1].response):  # type: ignore[union-attr]
        assert (reported.safety_identifier, reported.prompt_cache_key) == ("user-7", "conv-1")


@pytest.mark.parametrize("metadata", [
    {f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}, {"k": None}, ["k"], "k",
])
def test_metadata_beyond_the_apis_limits_is_a_400_naming_it(env: GatewayEnv, upstream: FakeUpstream,
                                                            metadata: object) -> None:
    r = _post(env, {"model": "echo", "input": "x", "metadata": metadata})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "metadata", r.text
    assert not upstream.received


def test_parallel_tool_calls_goes_to_chat(client: openai.OpenAI, env: GatewayEnv, upstream: FakeUpstream) -> None:
    """As sent, where there are tools: OpenAI's chat refuses it without (the Responses API does not)."""
    client.responses.create(model="echo", input="x", tools=[TOOL], parallel_tool_calls=False)  # type: ignore[list-item]
    assert upstream.last.json["parallel_tool_calls"] is False
    response = client.responses.create(model="echo", input="x", parallel_tool_calls=False)
    assert "parallel_tool_calls" not in upstream.last.json and response.parallel_tool_calls is False
    upstream.received.clear()
    r = _post(env, {"model": "echo", "input": "x", "parallel_tool_calls": "sometimes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "parallel_tool_calls", r.text
    assert not upstream.received


def test_an_answer_cut_short_has_its_message_incomplete(client: openai.OpenAI) -> None:
    """At ``max_output_tokens`` (chat's ``finish_reason: length``) the response and the message item
    it was writing are incomplete, streamed or not."""
    response = client.responses.create(model="echo", input="one two three four", max_output_tokens=2)
    events = list(client.responses.create(model="echo", input="one two three four", max_output_tokens=2,
                                          stream=True))
    assert events[-1].type == "response.incomplete"
    done = [e.item for e in events if e.type == "response.output_item.done"]  # type: ignore[union-attr]
    for final in (response, events[-1].response):  # type: ignore[union-attr]
        assert final.status == "incomplete" and final.incomplete_details is not None
        assert final.incomplete_details.reason == "max_output_tokens"
        assert [item.status for item in final.output] == ["incomplete"]  # type: ignore[union-attr]
    assert [item.status for item in done] == ["incomplete"]  # type: ignore[union-attr]


def test_a_refusal_is_the_messages_refusal_part(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """Chat's ``refusal`` is a ``refusal`` content part of the message, streamed as
    ``response.refusal.delta`` and ``.done``; a client may send it back as input."""
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": None, "refusal": "I can't help"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}
    envelope = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [{"index": 0, "delta": {"role": "assistant", "refusal": "I can't"}},
              {"index": 0, "delta": {"refusal": " help"}, "finish_reason": "stop"}]
    stream = Fault(status=200, headers={"content-type": "text/event-stream"}, body=b"".join(
        b"data: " + json.dumps(envelope | {"choices": [c]}).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n")
    upstream.fail_next(Fault(status=200, body=body), stream)
    response = client.responses.create(model="echo", input="x")
    events = list(client.responses.create(model="echo", input="x", stream=True))
    assert [e.type for e in events if "refusal" in e.type] == ["response.refusal.delta"] * 2 + ["response.refusal.done"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for final in (response, events[-1].response):  # type: ignore[union-attr]
        assert final.status == "completed" and final.output_text == ""
        assert [p.model_dump() for p in final.output[0].content] == [  # type: ignore[union-attr]
            {"type": "refusal", "refusal": "I can't help"}]
    client.responses.create(model="echo", input=[{"role": "user", "content": "x"}, *response.output,  # type: ignore[list-item]
                                                 {"role": "user", "content": "why?"}])
    assert upstream.last.json["messages"][1]["content"] == [{"type": "refusal", "refusal": "I can't help"}]
