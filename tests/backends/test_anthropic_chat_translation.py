"""The chat -> Messages API translation as an openai SDK user meets it: the request sent upstream,
the answer (whole and streamed) and the errors, against a loopback server speaking the Messages API."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import msgspec
import openai
import pytest

from backends.anthropic_wire import to_messages_request
from backends.base import BadRequest
from backends.openai_wire import ChatCompletionRequest
from tests.backends.claude_gateway import client, gateway_url, upstream  # noqa: F401  (fixtures)
from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import ScriptedAnthropic

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def body_of(**fields: Any) -> dict[str, Any]:
    request = msgspec.convert({"model": "claude"} | fields, ChatCompletionRequest)
    return to_messages_request(request, "claude-test", stream=False)


START = ("message_start", {"message": {"id": "msg_x", "type": "message", "role": "assistant", "model": "m",
                                       "content": [], "usage": {"input_tokens": 10, "output_tokens": 1,
                                                                "cache_read_input_tokens": 4,
                                                                "cache_creation_input_tokens": 6}}})


def text_block(index: int, text: str) -> list[tuple[str, dict[str, Any]]]:
    return [("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"index": index})]


def tool_block(index: int, call_id: str, arguments: str) -> list[tuple[str, dict[str, Any]]]:
    return [("content_block_start", {"index": index, "content_block": {"type": "tool_use", "id": call_id,
                                                                       "name": "search", "input": {}}}),
            ("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                               "partial_json": arguments}}),
            ("content_block_stop", {"index": index})]


def end(reason: str, output: int = 7, sequence: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                               "usage": {"output_tokens": output}}), ("message_stop", {})]


# ------------------------------------------------------------ the request


def test_system_and_developer_messages_become_the_system_prompt() -> None:
    body = body_of(messages=[{"role": "system", "content": "one"},
                             {"role": "developer", "content": [{"type": "text", "text": "two"}]},
                             {"role": "user", "content": "hi"},
                             {"role": "system", "content": "three"}])
    assert body["system"] == [{"type": "text", "text": text} for text in ("one", "two", "three")]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_consecutive_messages_of_a_role_are_merged() -> None:
    body = body_of(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                             {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"},
                             {"role": "user", "content": "e"}])
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["text"] for b in body["messages"][0]["content"]] == ["a", "b"]


def test_assistant_text_and_tool_calls_and_parallel_results() -> None:
    calls = [{"id": f"t{i}", "type": "function", "function": {"name": "search", "arguments": "{}"}} for i in (1, 2)]
    body = body_of(tools=TOOLS, messages=[{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "let me look", "tool_calls": calls},
                                          {"role": "tool", "tool_call_id": "t1", "content": "r1"},
                                          {"role": "tool", "tool_call_id": "t2",
                                           "content": [{"type": "text", "text": "r2"}]}])
    assert [b["type"] for b in body["messages"][1]["content"]] == ["text", "tool_use", "tool_use"]
    assert body["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "t1", "content": "r1"},
                                              {"type": "tool_result", "tool_use_id": "t2", "content": "r2"}]


def test_images_as_data_and_https_urls() -> None:
    body = body_of(messages=[{"role": "user", "content": [
        IMAGE, {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}}]}])
    assert [b["source"]["type"] for b in body["messages"][0]["content"]] == ["base64", "url"]


def test_an_image_in_a_tool_result_reaches_anthropic() -> None:
    body = body_of(messages=[{"role": "user", "content": "q"},
                             {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {
                                 "name": "search", "arguments": "{}"}}]},
                             {"role": "tool", "tool_call_id": "t1",
                              "content": [{"type": "text", "text": "a chart"}, IMAGE]}])
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t1"
    assert result["content"] == [{"type": "text", "text": "a chart"},
                                 {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                              "data": "AAAA"}}]


def test_a_tool_results_text_parts_stay_apart() -> None:
    """Several text parts of a tool message are a tool_result's text blocks, not one text run together."""
    body = body_of(messages=[{"role": "user", "content": "q"},
                             {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {
                                 "name": "search", "arguments": "{}"}}]},
                             {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "row 1"},
                                                                                {"type": "text", "text": "row 2"}]}])
    assert body["messages"][2]["content"][0]["content"] == [{"type": "text", "text": "row 1"},
                                                            {"type": "text", "text": "row 2"}]


def test_another_providers_call_ids_take_the_form_anthropic_accepts() -> None:
    """Anthropic takes tool_use ids of letters, digits, ``_`` and ``-`` only; a conversation begun on
    another provider (Kimi's ``functions.search:0``) has its ids made so, each call still paired with
    its result, two ids apart staying apart; an id of that form is sent as it is."""
    ids = ["functions.search:0", "functions.search.0", "toolu_01-A"]
    calls = [{"id": i, "type": "function", "function": {"name": "search", "arguments": "{}"}} for i in ids]
    body = body_of(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": calls},
                             *({"role": "tool", "tool_call_id": i, "content": "r"} for i in ids)])
    sent = [b["id"] for b in body["messages"][1]["content"]]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", i) for i in sent) and len(set(sent)) == 3
    assert sent[2] == "toolu_01-A"
    assert [b["tool_use_id"] for b in body["messages"][2]["content"]] == sent


@pytest.mark.parametrize("call_id", [{}, {"id": None}, {"id": ""}])
def test_a_conversations_call_without_an_id_is_a_400_naming_it(call_id: dict[str, Any]) -> None:
    """A call with no id (as some providers answer them) is taken in a conversation, but a tool_use
    block needs one: the Anthropic translation refuses it naming the field, not sends it empty."""
    call = {"type": "function", "function": {"name": "search", "arguments": "{}"}} | call_id
    with pytest.raises(BadRequest) as refused:
        body_of(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]}])
    assert refused.value.param == "messages[1].tool_calls[0].id"


@pytest.mark.parametrize("call_id", [{}, {"tool_call_id": ""}])
def test_a_tool_result_without_the_id_of_its_call_is_a_400_naming_it(call_id: dict[str, Any]) -> None:
    """A tool_result block names its tool_use by id (Anthropic refuses an empty one, naming its own
    ``tool_use_id``, a field the client never sent): a tool message without its ``tool_call_id`` (which
    OpenAI requires too) is a 400 naming that field, not a result sent for no call."""
    call = {"id": "t1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    with pytest.raises(BadRequest) as refused:
        body_of(tools=TOOLS, messages=[{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
                                       {"role": "tool", "content": "r"} | call_id])
    assert refused.value.param == "messages[2].tool_call_id"


@pytest.mark.parametrize("role", ["system", "developer"])
def test_an_image_in_a_system_message_is_a_400_not_dropped(role: str) -> None:
    with pytest.raises(BadRequest) as refused:
        body_of(messages=[{"role": role, "content": [{"type": "text", "text": "see"}, IMAGE]},
                          {"role": "user", "content": "hi"}])
    assert refused.value.param == "messages"


@pytest.mark.parametrize(("fields", "limit"), [({"max_tokens": 9}, 9), ({"max_completion_tokens": 8}, 8),
                                               ({"max_tokens": 9, "max_completion_tokens": 8}, 8), ({}, 4096)])
def test_the_output_limit(fields: dict[str, Any], limit: int) -> None:
    assert body_of(messages=[{"role": "user", "content": "x"}], **fields)["max_tokens"] == limit


def test_stop_as_a_string_or_a_list() -> None:
    assert body_of(messages=[{"role": "user", "content": "x"}], stop="END")["stop_sequences"] == ["END"]
    assert body_of(messages=[{"role": "user", "content": "x"}], stop=["a", "b"])["stop_sequences"] == ["a", "b"]


@pytest.mark.parametrize(("choice", "sent"), [("none", {"type": "none"}), ("required", {"type": "any"}),
                                              ("auto", {"type": "auto"}),
                                              ({"type": "function", "function": {"name": "search"}},
                                               {"type": "tool", "name": "search"})])
def test_tool_choice_variants(choice: Any, sent: dict[str, Any]) -> None:
    body = body_of(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice=choice)
    assert body["tool_choice"] == sent


def test_user_and_top_p_and_temperature() -> None:
    body = body_of(messages=[{"role": "user", "content": "x"}], user="u9", temperature=0.2, top_p=0.5)
    assert body["metadata"] == {"user_id": "u9"} and body["temperature"] == 0.2 and body["top_p"] == 0.5


def test_a_top_p_of_one_is_left_out_so_temperature_can_go_with_it() -> None:
    """Newer Claude models refuse temperature and top_p together; top_p 1 (the whole distribution, as
    clients such as LangChain send by default) asks for nothing, so it is not sent."""
    body = body_of(messages=[{"role": "user", "content": "x"}], temperature=0.7, top_p=1)
    assert body["temperature"] == 0.7 and "top_p" not in body
    assert body_of(messages=[{"role": "user", "content": "x"}], top_p=0.95)["top_p"] == 0.95


@pytest.mark.parametrize(("fields", "param"), [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"),
                                               ({"seed": 7}, "seed"), ({"temperature": 1.5}, "temperature"),
                                               ({"stop": ["a", "b", "c", "d", "e"]}, "stop")])
def test_what_anthropic_cannot_do_is_a_400_naming_it(client: openai.OpenAI, upstream: ScriptedAnthropic,
                                                     fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}], **fields)
    assert refused.value.param == param and upstream.received == []


# ------------------------------------------------------------ the answer


def test_a_whole_answer_counts_cache_reads_and_writes_in_the_prompt(client: openai.OpenAI,
                                                                    upstream: ScriptedAnthropic) -> None:
    upstream.script = (200, {"id": "msg_w", "type": "message", "role": "assistant", "model": "m",
                             "content": [{"type": "text", "text": "ok "},
                                         {"type": "tool_use", "id": "tu", "name": "search", "input": {"q": 1}}],
                             "stop_reason": "tool_use", "stop_sequence": None,
                             "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 4,
                                       "cache_creation_input_tokens": 6}})
    reply = client.chat.completions.create(model="claude", tools=TOOLS,  # type: ignore[arg-type]
                                           messages=[{"role": "user", "content": "x"}])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok "
    assert choice.message.tool_calls and choice.message.tool_calls[0].id == "tu"
    assert reply.usage and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (20, 7)
    assert reply.usage.prompt_tokens_details and reply.usage.prompt_tokens_details.cached_tokens == 4


def test_a_stream_of_text_and_two_tool_calls(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    upstream.script = [START, ("ping", {}), *text_block(0, "hm"), *tool_block(1, "tu_a", '{"q": "a"}'),
                       *tool_block(2, "tu_b", '{"q": "b"}'), *end("tool_use")]
    chunks = list(client.chat.completions.create(model="claude", tools=TOOLS, stream=True,  # type: ignore[arg-type]
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "x"}]))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].id == "msg_x"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hm"
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(c.index, c.id) for c in calls if c.id] == [(0, "tu_a"), (1, "tu_b")]
    assert "".join(c.function.arguments or "" for c in calls if c.index == 1) == '{"q": "b"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (20, 7, 27)
    assert usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens == 4


def test_a_server_tools_streamed_input_is_no_tool_call(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    """A server tool's call (web search, run by Anthropic) streams its input as ``input_json_delta``
    too: it is none of the client's tool calls, as in a whole answer, and the client's call keeps its
    own arguments."""
    search = [("content_block_start", {"index": 0, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1",
                                                                     "name": "web_search", "input": {}}}),
              ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta",
                                                             "partial_json": '{"query": "x"}'}}),
              ("content_block_stop", {"index": 0}),
              ("content_block_start", {"index": 1, "content_block": {"type": "web_search_tool_result",
                                                                     "tool_use_id": "srvtoolu_1", "content": []}}),
              ("content_block_stop", {"index": 1})]
    upstream.script = [START, *search, *text_block(2, "found"), *tool_block(3, "tu_a", '{"q": "a"}'), *end("tool_use")]
    with client.chat.completions.stream(model="claude", tools=TOOLS,  # type: ignore[arg-type]
                                        messages=[{"role": "user", "content": "x"}]) as stream:
        message = stream.get_final_completion().choices[0].message
    assert message.content == "found"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("tu_a", "search", '{"q": "a"}')]


@pytest.mark.parametrize(("reason", "finish"), [("max_tokens", "length"), ("end_turn", "stop"),
                                                ("stop_sequence", "stop"), ("refusal", "content_filter")])
def test_a_streams_finish_reason(client: openai.OpenAI, upstream: ScriptedAnthropic, reason: str, finish: str) -> None:
    sequence = "END" if reason == "stop_sequence" else None
    upstream.script = [START, *text_block(0, "a"), *end(reason, sequence=sequence)]
    chunks = list(client.chat.completions.create(model="claude", stream=True,
                                                 messages=[{"role": "user", "content": "x"}]))
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == finish
    if sequence:
        assert last.choices[0].model_extra and last.choices[0].model_extra.get("stop_reason") == "END"


# ------------------------------------------------------------ errors


def test_a_rate_limit_passes_on_its_retry_after(upstream: ScriptedAnthropic) -> None:
    """On a gateway of its own: the Retry-After holds its deployment off."""
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": upstream.url, "api_key": "sk"}
    upstream.answer_headers = {"retry-after": "7"}
    upstream.fail_next(429, "rate_limit_error", "slow down")
    try:
        with admin_gateway([{"name": "claude", "max_retries": 0, "deployments": [deployment]}]) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
            with pytest.raises(openai.RateLimitError) as err:
                client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}])
    finally:
        upstream.answer_headers = {}
    assert err.value.response.headers.get("retry-after") == "7"


def test_an_invalid_request_is_a_400_in_openais_shape(client: openai.OpenAI, upstream: ScriptedAnthropic) -> None:
    upstream.fail_next(400, "invalid_request_error", "messages.0.content: bad")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}])
    assert "messages.0.content: bad" in err.value.message
    assert isinstance(err.value.body, dict) and err.value.body.get("type") == "invalid_request_error"


@pytest.mark.parametrize(("kind", "status"), [("overloaded_error", 503), ("api_error", 503),
                                              ("rate_limit_error", 429), ("invalid_request_error", 400)])
def test_an_error_event_before_any_text_is_mapped_as_the_status_would_be(
        gateway_url: str, upstream: ScriptedAnthropic, kind: str, status: int) -> None:
    upstream.script = [("error", {"error": {"type": kind, "message": "boom"}})]
    answer = httpx.post(gateway_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                        json={"model": "claude", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert answer.status_code == status, answer.text


def test_an_error_event_mid_stream_ends_the_stream_with_an_error(gateway_url: str,
                                                                  upstream: ScriptedAnthropic) -> None:
    upstream.script = [START, *text_block(0, "part"), ("error", {"error": {"type": "overloaded_error",
                                                                           "message": "Overloaded"}})]
    with httpx.stream("POST", gateway_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      json={"model": "claude", "stream": True,
                            "messages": [{"role": "user", "content": "x"}]}) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
    assert "error" in events[-1] and "part" in json.dumps(events)
