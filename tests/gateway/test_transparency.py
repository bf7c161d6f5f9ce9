"""The gateway is transparent (issue 19): what the app sends reaches the provider, what the provider
answers reaches the app, through the openai SDK against a gateway on loopback and a real HTTP
upstream that records what it receives and answers with today's full response shape."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import RICH_LOGPROBS, RICH_MESSAGE, RICH_USAGE, FakeUpstream, Fault
from tests.support.loose_tool_calls import ANSWERED_CALLS, STREAMED, answered, streamed

UNMODELLED = {
    "reasoning_effort": "low",
    "metadata": {"app": "t", "run": "1"},
    "store": True,
    "service_tier": "flex",
    "prompt_cache_key": "pck-1",
    "safety_identifier": "sid-1",
    "verbosity": "low",
    "prediction": {"type": "content", "content": "hi"},
    "web_search_options": {"search_context_size": "low"},
    "modalities": ["text"],
    # vLLM's extra parameters
    "structured_outputs": {"choice": ["a", "b"]},
    "guided_json": {"type": "object"},
    "spaces_between_special_tokens": False,
}
VLLM_MODELLED = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "skip_special_tokens": False,
                 "include_stop_str_in_output": True, "stop_token_ids": [7], "prompt_logprobs": 1,
                 "chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture
def client(env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url, api_key=ADMIN_KEY, max_retries=0)


def _chat(client: openai.OpenAI, **kw: object) -> object:
    return client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                          extra_body=UNMODELLED | VLLM_MODELLED, **kw)  # type: ignore[call-overload]


def test_every_request_field_reaches_the_upstream(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    _chat(client, user="u-1", max_completion_tokens=5)
    sent = upstream.last.json
    for name, value in (UNMODELLED | VLLM_MODELLED).items():
        assert sent[name] == value, name
    assert sent["user"] == "u-1" and sent["max_completion_tokens"] == 5 and sent["model"] == "upstream-echo"
    assert "stream" not in sent and "stream_options" not in sent


def test_what_vllm_takes_beyond_openais_limits_reaches_the_upstream(client: openai.OpenAI,
                                                                    upstream: FakeUpstream) -> None:
    """OpenAI's own limits (temperature to 2, four stop strings) are its API's to enforce: a vLLM
    upstream takes a temperature of 3 and eight stop strings, so the gateway passes them on."""
    stops = [f"<stop{i}>" for i in range(8)]
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}], temperature=3,
                                   stop=stops)
    client.completions.create(model="echo", prompt="hi", temperature=2.5, stop=stops)
    assert (upstream.last.json["temperature"], upstream.last.json["stop"]) == (2.5, stops)
    assert upstream.received[-2].json["temperature"] == 3


def test_a_null_user_is_passed_on_as_sent(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """``user: null`` asks for nothing, as OpenAI's optional fields do: passed on, not a 400."""
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"user": None})
    assert upstream.last.json["user"] is None


def test_an_assistant_turns_thinking_blocks_reach_the_upstream_as_sent(client: openai.OpenAI,
                                                                      upstream: FakeUpstream) -> None:
    """LiteLLM's ``thinking_blocks`` (Anthropic's, signatures included) on a message sent back: the
    gateway reads them for an ``anthropic`` deployment only; an HTTP upstream gets them unchanged."""
    blocks = [{"type": "thinking", "thinking": "hm", "signature": "sig", "extra": 1},
              {"type": "redacted_thinking", "data": "xyz"}]
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "thinking_blocks": blocks},
                {"role": "user", "content": "c"}]
    client.chat.completions.create(model="echo", messages=messages)  # type: ignore[arg-type]
    assert upstream.last.json["messages"] == messages


def test_streamed_request_keeps_every_field(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    list(_chat(client, stream=True))  # type: ignore[call-overload]
    sent = upstream.last.json
    for name, value in (UNMODELLED | VLLM_MODELLED).items():
        assert sent[name] == value, name
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_completions_forward_unmodelled_fields(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    client.completions.create(model="echo", prompt="hi", extra_body={"guided_choice": ["a"], "metadata": {"k": "v"}})
    assert upstream.last.json["guided_choice"] == ["a"] and upstream.last.json["metadata"] == {"k": "v"}


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": True}},
    {"type": "json_object"},
    # vLLM's structural tags, which the built-in engine refuses: an HTTP upstream gets them as sent
    {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f"], "tags": []},
     "extra": {"k": "v"}},
])
def test_response_format_passed_through(client: openai.OpenAI, upstream: FakeUpstream, fmt: dict[str, object]) -> None:
    client.completions.create(model="echo", prompt="hi", extra_body={"response_format": fmt})
    assert upstream.last.json["response_format"] == fmt
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"response_format": fmt})
    assert upstream.last.json["response_format"] == fmt


def test_a_strict_sent_as_null_is_relayed_as_sent(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """OpenAI's schema lets a function's and a JSON schema format's ``strict`` be null (the openai SDK's
    ``Optional[bool]``; pydantic-built tools send it so): no 400, the upstream gets it as sent."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": None}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": None}}
    client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                   tools=tools, response_format=fmt)  # type: ignore[arg-type]
    assert upstream.last.json["tools"] == tools and upstream.last.json["response_format"] == fmt


def test_unary_answer_relayed_field_by_field(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.rich = True
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    raw = reply.model_dump()
    assert raw["model"] == "echo"  # the gateway owns the model name as the client gave it
    assert raw["id"] == "chatcmpl-rich" and raw["service_tier"] == "default" and raw["system_fingerprint"] == "fp_rich"
    message = raw["choices"][0]["message"]
    assert message["refusal"] is None and message["reasoning_content"] == RICH_MESSAGE["reasoning_content"]
    assert message["annotations"][0]["url_citation"]["url"] == "https://example.com"
    assert raw["choices"][0]["stop_reason"] is None
    assert raw["choices"][0]["logprobs"] == {**RICH_LOGPROBS, "content": [
        {**RICH_LOGPROBS["content"][0], "top_logprobs": []}]}  # type: ignore[dict-item]
    assert raw["choices"][0]["logprobs"]["refusal"] is None
    for part in ("completion_tokens_details", "prompt_tokens_details"):
        assert raw["usage"][part].items() >= RICH_USAGE[part].items(), part  # type: ignore[union-attr]


def test_completion_answer_relayed(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.rich = True
    raw = client.completions.create(model="echo", prompt="hi").model_dump()
    assert raw["model"] == "echo" and raw["choices"][0]["stop_reason"] == "END" and raw["service_tier"] == "default"
    assert raw["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3


def test_streamed_chunks_relayed_field_by_field(client: openai.OpenAI, upstream: FakeUpstream,
                                               env: GatewayEnv) -> None:
    upstream.rich = True
    chunks = [c.model_dump() for c in client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})]
    assert all(c["model"] == "echo" and c["service_tier"] == "default" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["refusal"] is None
    assert [d.get("reasoning_content") for d in deltas] == [None, "thought", None, None]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]].count("stop") == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    record = env.usage.wait_for(1)[0]
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens, record.exact) == (9, 4, 2, True)


def test_streamed_usage_dropped_when_not_asked(client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv) -> None:
    upstream.rich = True
    chunks = [c.model_dump() for c in client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert all(c["usage"] is None for c in chunks) and all(c["choices"] for c in chunks)
    assert env.usage.wait_for(1)[0].completion_tokens == 4  # still metered from the upstream's usage


def test_drop_and_rename_params(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    client.chat.completions.create(model="trimmed", messages=[{"role": "user", "content": "hi"}],
                                   max_completion_tokens=3, store=True, extra_body={"verbosity": "low"})
    sent = upstream.last.json
    assert "store" not in sent and "max_completion_tokens" not in sent
    assert sent["max_tokens"] == 3 and sent["verbosity"] == "low"


def test_tool_choice_without_tools_is_400(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                       tool_choice="auto")
    assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert upstream.received == []


def test_upstream_unknown_model_is_a_502(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """The gateway serves the model the client named; its upstream not knowing it is the gateway's
    misconfiguration (see tests/gateway/test_routing_failover.py), not the client's 404."""
    upstream.fail_next(Fault(status=404, body={"error": {"message": "The model `upstream-echo` does not exist",
                                                         "type": "invalid_request_error", "code": "model_not_found"}}))
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502 and caught.value.code == "upstream_model_not_found"


def test_routes_without_v1(env: GatewayEnv, upstream: FakeUpstream) -> None:
    root = env.server.url
    client = openai.OpenAI(base_url=root, api_key=ADMIN_KEY, max_retries=0)
    assert client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b"}]).model == "echo"
    assert client.completions.create(model="echo", prompt="a b").choices[0].text == "a b"
    assert upstream.received[-1].path == "/v1/completions"


def test_openapi_lists_accepted_fields(env: GatewayEnv) -> None:
    schema = httpx.get(env.server.url + "/schema/openapi.json").json()
    text = str(schema)
    for name in ("chat_template_kwargs", "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output"):
        assert name in text, name
    assert "/chat/completions" in schema["paths"] and "/v1/chat/completions" in schema["paths"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_continuous_usage_relayed_in_every_chunk(client: openai.OpenAI, upstream: FakeUpstream, env: GatewayEnv,
                                                 include_usage: bool) -> None:
    """vLLM's ``continuous_usage_stats``: with ``include_usage`` (as vLLM needs it), each chunk's usage
    reaches the client as the upstream sent it, and the closing usage chunk; without it, as from vLLM,
    no usage at all. The upstream is always asked for usage; the metering stays exact."""
    options = {"continuous_usage_stats": True} | ({"include_usage": True} if include_usage else {})
    stream = client.chat.completions.create(  # type: ignore[call-overload]
        model="echo", messages=[{"role": "user", "content": "a b c"}], stream=True, stream_options=options)
    chunks = [c.model_dump() for c in stream]
    assert upstream.last.json["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    relayed = [c for c in chunks if c["choices"]]
    if include_usage:
        assert [c["usage"]["completion_tokens"] for c in relayed] == [0, 1, 2, 3, 3]
    else:
        assert all(c["usage"] is None for c in relayed)
    assert len(chunks) == len(relayed) + include_usage
    record = env.usage.wait_for(1)[0]
    assert (record.completion_tokens, record.exact) == (3, True)


def test_continuous_usage_relayed_in_every_completion_chunk(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    stream = client.completions.create(  # type: ignore[call-overload]
        model="echo", prompt="a b c", stream=True, stream_options={"continuous_usage_stats": True,
                                                                  "include_usage": True})
    chunks = [c.model_dump() for c in stream]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3, 3]
    assert all(c["choices"] for c in chunks[:-1]) and not chunks[-1]["choices"]


@pytest.mark.parametrize("reason", ["insufficient_system_resource", "model_length", "abort"])
def test_a_finish_reason_the_gateway_does_not_know_is_relayed(client: openai.OpenAI, upstream: FakeUpstream,
                                                              reason: str) -> None:
    """Providers document finish reasons of their own (DeepSeek's ``insufficient_system_resource``,
    Mistral's ``model_length``, vLLM's ``abort``): relayed as sent, not a 502."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": reason}
    upstream.fail_next(Fault(status=200, body={"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                                               "choices": [choice]}))
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].finish_reason == reason and reply.choices[0].message.content == "a"
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": reason}]}
    upstream.fail_next(Fault(status=200, headers={"content-type": "text/event-stream"},
                             body=b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"))
    chunks = list(client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True))
    assert [c.choices[0].finish_reason for c in chunks] == [reason]
    text = {"id": "x", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": "a", "finish_reason": reason}]}
    upstream.fail_next(Fault(status=200, body=text))
    assert client.completions.create(model="echo", prompt="hi").choices[0].finish_reason == reason


# ---------------------------------------------------------------- tool calls off OpenAI's schema


@pytest.mark.parametrize("case", list(STREAMED))
def test_tool_call_deltas_off_openais_schema_are_relayed_as_sent(client: openai.OpenAI, upstream: FakeUpstream,
                                                                 env: GatewayEnv, case: str) -> None:
    """Call deltas with no ``index`` or a null one (Gemini, older Ollama, mistral.rs), or parallel calls
    all under index 0 (Ollama): the stream is relayed to its end, each chunk's calls as the upstream
    sent them (no index or id made up), as a client of the provider itself gets them; and metered."""
    upstream.fail_next(streamed(case))
    chunks = list(client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True))
    calls = [c.choices[0].delta.to_dict()["tool_calls"] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls == STREAMED[case][0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    record = env.usage.wait_for(1)[0]
    assert (record.status, record.error_type, record.completion_tokens) == (200, None, 9)


def test_tool_calls_without_an_id_are_relayed_as_sent(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    """A whole answer whose calls have no ``id``, or a null one, is relayed as it came, not a 502."""
    upstream.fail_next(answered())
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.to_dict()["tool_calls"] == ANSWERED_CALLS
    assert reply.choices[0].finish_reason == "tool_calls"


def test_optional_fields_sent_as_null_are_relayed_as_sent(client: openai.OpenAI, upstream: FakeUpstream,
                                                          env: GatewayEnv) -> None:
    """``null`` for an answer's or a delta's optional field (``tool_calls``, ``function_call``, a delta's
    ``role``: OpenAI's schema allows it; LiteLLM, LM Studio and others send it) is no 502: relayed, metered."""
    message = {"role": "assistant", "content": "a b", "tool_calls": None, "function_call": None,
               "thinking_blocks": None, "refusal": None}
    upstream.fail_next(Fault(status=200, body={
        "id": "x", "object": "chat.completion", "created": 1, "model": "m", "usage": RICH_USAGE,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}]}))
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.to_dict(exclude_none=False) == message
    delta = {"role": None, "content": "a b", "tool_calls": None, "function_call": None, "thinking_blocks": None}
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]}
    usage = chunk | {"choices": [], "usage": RICH_USAGE}
    upstream.fail_next(Fault(status=200, headers={"content-type": "text/event-stream"}, body=b"".join(
        b"data: " + json.dumps(event).encode() + b"\n\n" for event in (chunk, usage)) + b"data: [DONE]\n\n"))
    chunks = list(client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True))
    assert [c.choices[0].delta.to_dict(exclude_none=False) for c in chunks] == [delta]
    records = env.usage.wait_for(2)
    assert [(r.status, r.completion_tokens, r.exact) for r in records] == [
        (200, RICH_USAGE["completion_tokens"], True)] * 2
