"""The anthropic provider: OpenAI requests translated to the Messages API and back, through the
gateway, against a loopback server speaking the Messages API."""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec
import openai
import pytest

from backends.anthropic_wire import to_messages_request
from backends.openai_wire import ChatCompletionRequest
from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

TOOLS = [{"type": "function", "function": {"name": "search", "description": "find things",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def gateway(anthropic_upstream: FakeAnthropic) -> Iterator[tuple[ServerThread, RecordingSink]]:
    settings = parse_settings({"models": [{"name": "claude", "max_retries": 0, "deployments": [{
        "provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url, "api_key": "sk-ant"}]}]},
        env={})
    usage = RecordingSink()
    with scripted_gateway(settings, usage=usage) as server:
        yield server, usage


@pytest.fixture
def client(gateway: tuple[ServerThread, RecordingSink], anthropic_upstream: FakeAnthropic) -> openai.OpenAI:
    anthropic_upstream.received.clear()
    anthropic_upstream.faults.clear()
    gateway[1].records.clear()
    return openai.OpenAI(base_url=gateway[0].url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def test_translation_of_a_full_request() -> None:
    request = msgspec.convert(
        {
            "model": "claude",
            "max_tokens": 50,
            "temperature": 0.7,
            "top_p": 0.9,
            "stop": ["END"],
            "user": "u1",
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "search"}},
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look "},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "t1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "t1", "content": "found"},
                {"role": "user", "content": "thanks"},
            ],
        },
        ChatCompletionRequest,
    )
    body = to_messages_request(request, "claude-test", stream=False)
    assert body["system"] == [{"type": "text", "text": "be brief"}]
    assert body["max_tokens"] == 50 and body["temperature"] == 0.7
    assert body["stop_sequences"] == ["END"] and body["metadata"] == {"user_id": "u1"}
    assert body["tool_choice"] == {"type": "tool", "name": "search"}
    assert body["tools"][0]["input_schema"]["properties"] == {"q": {"type": "string"}}
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]  # the tool result and the next user turn are merged
    assert body["messages"][0]["content"][1]["source"] == {"type": "base64", "media_type": "image/png", "data": "AAAA"}
    assert body["messages"][1]["content"][0] == {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}}
    assert body["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "found"}


def test_chat_round_trip(
    client: openai.OpenAI, anthropic_upstream: FakeAnthropic, gateway: tuple[ServerThread, RecordingSink]
) -> None:
    reply = client.chat.completions.create(
        model="claude",
        max_tokens=20,
        stop=["zzz"],
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "hello from openai"}],
    )
    assert reply.choices[0].message.content == "hello from openai"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert reply.usage.prompt_tokens_details is not None and reply.usage.prompt_tokens_details.cached_tokens == 2
    sent = anthropic_upstream.received[-1]
    assert sent["model"] == "claude-test" and sent["system"] == [{"type": "text", "text": "sys"}]
    assert sent["stop_sequences"] == ["zzz"]
    assert anthropic_upstream.headers[-1]["x-api-key"] == "sk-ant"
    assert anthropic_upstream.headers[-1]["anthropic-version"] == "2023-06-01"
    record = gateway[1].wait_for(1)[0]
    assert record.exact and record.cached_tokens == 2 and record.provider == "anthropic"


def test_max_tokens_maps_to_length(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="claude", max_tokens=1, messages=[{"role": "user", "content": "two words"}]
    )
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == "two "


def test_stream_round_trip_with_usage(client: openai.OpenAI, gateway: tuple[ServerThread, RecordingSink]) -> None:
    chunks = list(
        client.chat.completions.create(
            model="claude",
            messages=[{"role": "user", "content": "stream this please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "stream this please"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert gateway[1].wait_for(1)[0].exact
    whole = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "stream this please"}])
    assert chunks[-1].usage == whole.usage  # the cached tokens (prompt_tokens_details) too
    assert whole.usage is not None and whole.usage.prompt_tokens_details is not None


def test_tool_calls_non_stream_and_stream(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="claude",
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "tool:weather"}],
    )
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "search" and json.loads(call.function.arguments) == {"q": "weather"}
    chunks = list(
        client.chat.completions.create(
            model="claude",
            tools=TOOLS,
            stream=True,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "tool:rain"}],
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id == "toolu_1" and deltas[0].function.name == "search"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"q": "rain"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_full_context_window_is_finish_reason_length(client: openai.OpenAI,
                                                       anthropic_upstream: FakeAnthropic) -> None:
    """Anthropic's ``model_context_window_exceeded`` cut the answer short, as ``max_tokens`` does."""
    anthropic_upstream.stop_reason = "model_context_window_exceeded"
    try:
        whole = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "a b"}])
        chunks = list(client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "a b"}],
                                                     stream=True))
    finally:
        anthropic_upstream.stop_reason = None
    assert whole.choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_text_completion_served_as_chat(client: openai.OpenAI) -> None:
    assert client.completions.create(model="claude", prompt="legacy prompt").choices[0].text == "legacy prompt"
    chunks = list(client.completions.create(model="claude", prompt="a b", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "a b"


def test_a_text_completion_names_the_stop_sequence_it_met(client: openai.OpenAI) -> None:
    """As a chat answer does (vLLM's ``stop_reason``), whole and streamed."""
    whole = client.completions.create(model="claude", prompt="one END two", stop=["END"]).choices[0]
    chunks = list(client.completions.create(model="claude", prompt="one END two", stop=["END"], stream=True))
    last = [c.choices[0] for c in chunks if c.choices][-1]
    for choice in (whole, last):
        assert choice.finish_reason == "stop"
        assert choice.model_extra and choice.model_extra.get("stop_reason") == "END"


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_an_empty_text_prompt_is_a_400_naming_prompt(client: openai.OpenAI, prompt: str) -> None:
    """Named as the /v1/completions client sent it, not as ``messages[0].content`` of the chat it is served as."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="claude", prompt=prompt)
    assert refused.value.param == "prompt"


@pytest.mark.parametrize(
    ("status", "kind", "message", "error", "code"),
    [
        (429, "rate_limit_error", "slow down", openai.RateLimitError, 429),
        (529, "overloaded_error", "overloaded", openai.InternalServerError, 503),
        (500, "api_error", "boom", openai.InternalServerError, 503),
        (401, "authentication_error", "bad key", openai.APIStatusError, 502),
        (
            400,
            "invalid_request_error",
            "prompt is too long: 300000 tokens > 200000 maximum",
            openai.BadRequestError,
            400,
        ),
    ],
)
def test_errors_are_mapped(
    client: openai.OpenAI,
    anthropic_upstream: FakeAnthropic,
    status: int,
    kind: str,
    message: str,
    error: type,
    code: int,
) -> None:
    anthropic_upstream.fail_next(status, kind, message)
    with pytest.raises(error) as err:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == code  # type: ignore[attr-defined]
    if status == 400:
        assert err.value.code == "context_length_exceeded"  # type: ignore[attr-defined]


def test_n_above_one_is_rejected(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="claude", n=2, messages=[{"role": "user", "content": "x"}])
    assert err.value.param == "n"


def test_anthropic_sdk_through_the_gateway_to_the_anthropic_provider(
    gateway: tuple[ServerThread, RecordingSink], anthropic_upstream: FakeAnthropic
) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=gateway[0].url, api_key=ADMIN_KEY, max_retries=0)
    message = client.messages.create(
        model="claude", max_tokens=32, system="sys", messages=[{"role": "user", "content": "both ways"}]
    )
    assert message.content[0].text == "both ways"  # type: ignore[union-attr]
    assert anthropic_upstream.received[-1]["system"] == "sys"
    with client.messages.stream(
        model="claude",
        max_tokens=32,
        messages=[{"role": "user", "content": "tool:x"}],
        tools=[{"name": "search", "input_schema": {"type": "object"}}],
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == {"q": "x"}  # type: ignore[union-attr]


@pytest.mark.parametrize(("asked", "sent"), [("auto", "auto"), ("default", "standard_only"),
                                             ("standard_only", "standard_only"), (None, None)])  # null asks for none
def test_openai_service_tiers_are_mapped_to_anthropics(client: openai.OpenAI, anthropic_upstream: FakeAnthropic,
                                                       asked: str, sent: str) -> None:
    for stream in (False, True):
        answer = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}],
                                                stream=stream, service_tier=asked)  # type: ignore[arg-type]
        if stream:
            list(answer)  # type: ignore[arg-type]
        assert anthropic_upstream.received[-1].get("service_tier", "not sent") == (sent or "not sent")


@pytest.mark.parametrize("asked", ["flex", "priority", "scale"])
def test_a_service_tier_anthropic_cannot_honour_is_a_400(client: openai.OpenAI, anthropic_upstream: FakeAnthropic,
                                                        asked: str) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}],
                                           stream=stream, service_tier=asked)  # type: ignore[arg-type]
        assert refused.value.param == "service_tier" and asked in refused.value.message
    assert anthropic_upstream.received == []
