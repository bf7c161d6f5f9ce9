"""Issue 19 on the Anthropic side: an OpenAI request's unmodelled fields mapped for an Anthropic
upstream (reasoning_effort -> thinking, metadata, Anthropic's own fields), matched stop sequences
reported through ``/v1/messages`` (streaming too), the real input tokens in ``message_start``, and
no silent cut of stop sequences; the openai and anthropic SDKs against a gateway on loopback and a
loopback server speaking the Messages API."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import msgspec
import openai
import pytest

from backends.anthropic_wire import to_messages_request
from backends.openai_wire import ChatCompletionRequest, ChatMessage, set_extra_params
from tests.backends.conftest import admin_gateway, sse_events
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.servers import ServerThread


@pytest.fixture(scope="module")
def gateway(anthropic_upstream: FakeAnthropic) -> Iterator[ServerThread]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url,
                  "api_key": "sk-ant"}
    with admin_gateway([
        {"name": "claude", "max_retries": 0, "deployments": [deployment]},
        {"name": "claude-trim", "max_retries": 0,
         "deployments": [deployment | {"name": "trim", "drop_params": ["verbosity"]}]},
    ]) as server:
        yield server


@pytest.fixture
def upstream(anthropic_upstream: FakeAnthropic) -> FakeAnthropic:
    anthropic_upstream.received.clear()
    anthropic_upstream.faults.clear()
    return anthropic_upstream


@pytest.fixture
def oai(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=ADMIN_KEY, max_retries=0)


@pytest.fixture
def ant(gateway: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=ADMIN_KEY, max_retries=0)


def test_reasoning_effort_becomes_a_thinking_budget(oai: openai.OpenAI, upstream: FakeAnthropic) -> None:
    oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}], max_tokens=8000,
                                temperature=1, reasoning_effort="medium", user="u-9",
                                metadata={"user_id": "u-10"}, store=True)
    sent = upstream.received[-1]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert sent["temperature"] == 1  # the one temperature Anthropic takes with thinking
    assert sent["metadata"] == {"user_id": "u-10"}  # Anthropic's own key wins over user (it takes no other)
    assert "store" not in sent and "reasoning_effort" not in sent


def test_a_thinking_budget_without_a_limit_leaves_the_answer_its_room() -> None:
    """With no limit from the client nor the gateway (``quotas.default_max_tokens: null``), the
    thinking budget goes on top of the deployment's default max_tokens instead of taking all but
    one of its tokens; a limit someone set still holds both."""
    request = ChatCompletionRequest(model="claude", messages=[ChatMessage(role="user", content="hi")])
    set_extra_params(request, {"reasoning_effort": msgspec.Raw(b'"high"')})
    body = to_messages_request(request, "claude-test", stream=False, max_tokens=4096, answer_room=True)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 16384} and body["max_tokens"] == 4096 + 16384
    body = to_messages_request(request, "claude-test", stream=False, max_tokens=4096)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4095} and body["max_tokens"] == 4096


@pytest.mark.parametrize(("field", "value"), [("temperature", 0.5), ("top_k", 5)])
def test_what_thinking_cannot_honour_is_a_400_naming_it(oai: openai.OpenAI, upstream: FakeAnthropic,
                                                        field: str, value: float) -> None:
    """Anthropic's extended thinking takes no temperature but 1 and no top_k: refused, never dropped."""
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}],
                                    reasoning_effort="medium", max_tokens=4000, extra_body={field: value})
    assert err.value.param == field and field in err.value.message
    assert upstream.received == []


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_reasoning_effort_with_no_room_for_a_thinking_budget_is_a_400_naming_the_limit(
        oai: openai.OpenAI, upstream: FakeAnthropic, limit: str) -> None:
    """Anthropic's budget_tokens is at least 1024 and below max_tokens: a smaller limit cannot hold one."""
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}],
                                    reasoning_effort="low", extra_body={limit: 1024})
    assert err.value.param == limit and "1024" in err.value.message
    assert upstream.received == []
    oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}],
                                reasoning_effort="low", extra_body={limit: 1025})
    assert upstream.received[-1]["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_anthropic_fields_pass_as_they_are(oai: openai.OpenAI, upstream: FakeAnthropic) -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}], max_tokens=4000,
                                extra_body={"thinking": thinking, "service_tier": "standard_only", "top_k": 3})
    sent = upstream.received[-1]
    assert sent["thinking"] == thinking and sent["service_tier"] == "standard_only" and sent["top_k"] == 3


def test_unmappable_field_is_a_400_naming_it(oai: openai.OpenAI, upstream: FakeAnthropic) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}],
                                    extra_body={"verbosity": "low"})
    assert caught.value.body["param"] == "verbosity"  # type: ignore[index]
    assert upstream.received == []
    oai.chat.completions.create(model="claude-trim", messages=[{"role": "user", "content": "hi"}],
                                extra_body={"verbosity": "low"})  # the deployment drops it
    assert "verbosity" not in upstream.received[-1]


def test_stop_sequence_reported_through_messages(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    sequences = ["s1", "s2", "s3", "s4", "END"]
    message = ant.messages.create(model="claude", max_tokens=64, stop_sequences=sequences,
                                  messages=[{"role": "user", "content": "one two END three"}])
    assert upstream.received[-1]["stop_sequences"] == sequences  # all of them: no silent cut
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "END"
    assert message.content[0].text == "one two "  # type: ignore[union-attr]


def test_stop_sequence_reported_when_streaming(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    with ant.messages.stream(model="claude", max_tokens=64, stop_sequences=["END"],
                             messages=[{"role": "user", "content": "one two END three"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    usage = start.message.usage  # the upstream's own, as it sent it: 4 uncached + 2 read from its cache
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (4, 2)
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "END"


def test_chat_choice_carries_the_matched_stop(oai: openai.OpenAI, upstream: FakeAnthropic) -> None:
    reply = oai.chat.completions.create(model="claude", messages=[{"role": "user", "content": "a END b"}],
                                        stop=["END"])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].model_extra == {"stop_reason": "END"}  # type: ignore[attr-defined]
    assert reply.choices[0].message.refusal is None


def test_errors_on_messages_routes_take_anthropic_shape(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        ant.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.count_tokens(model="nope", messages=[{"role": "user", "content": "x"}])
    assert ant.messages.count_tokens(model="claude", messages=[{"role": "user", "content": "a b"}]).input_tokens > 0


MESSAGES_BODY = {
    "max_tokens": 2048,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u-7"},
    "service_tier": "auto",
    "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
         "title": "doc", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "hello there", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
    ]}],
}


def test_messages_request_reaches_an_anthropic_upstream_as_sent(ant: anthropic.Anthropic,
                                                                 upstream: FakeAnthropic) -> None:
    message = ant.messages.create(model="claude", **MESSAGES_BODY)  # type: ignore[arg-type]
    sent = upstream.received[-1]
    assert sent == MESSAGES_BODY | {"model": "claude-test"}
    assert message.model == "claude"
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].signature == "sig-1"  # type: ignore[union-attr]
    assert message.content[1].text == "hello there"  # type: ignore[union-attr]


def test_messages_stream_to_an_anthropic_upstream(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    with ant.messages.stream(model="claude", **MESSAGES_BODY) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    sent = upstream.received[-1]
    assert sent == MESSAGES_BODY | {"model": "claude-test", "stream": True}
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "let me think"  # type: ignore[union-attr]


def test_thinking_reaches_openai_clients_as_reasoning_content(oai: openai.OpenAI, upstream: FakeAnthropic) -> None:
    kw = dict(model="claude", messages=[{"role": "user", "content": "hi"}], max_tokens=4000,
              reasoning_effort="low")
    reply = oai.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert reply.choices[0].message.reasoning_content == "let me think"  # type: ignore[attr-defined]
    deltas = [c.choices[0].delta for c in oai.chat.completions.create(**kw, stream=True) if c.choices]  # type: ignore[call-overload]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "let me think"


def test_a_streamed_anthropic_answer_is_relayed_event_for_event(gateway: ServerThread, upstream: FakeAnthropic) -> None:
    """Thinking signatures, pings and every other event reach an Anthropic client as the upstream sent
    them; only the model's name is the one the client asked for."""
    body = MESSAGES_BODY | {"stream": True}
    direct = sse_events(upstream.url + "/v1/messages", body | {"model": "claude-test"},
                         {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"})
    relayed = sse_events(gateway.url + "/v1/messages", body | {"model": "claude"}, {"x-api-key": ADMIN_KEY})
    assert [k for k, _ in relayed] == [k for k, _ in direct]
    assert ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "signature_delta", "signature": "sig-1"}}) in relayed
    assert ("ping", {"type": "ping"}) in relayed
    start, want = relayed[0][1], direct[0][1]
    assert start["message"]["model"] == "claude"  # type: ignore[index]
    assert start | {"message": start["message"] | {"model": "claude-test"}} == want  # type: ignore[operator]
    assert relayed[1:] == direct[1:]


def test_the_sdk_keeps_the_thinking_signature_when_streaming(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    with ant.messages.stream(model="claude", **MESSAGES_BODY) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert final.content[0].signature == "sig-1"  # type: ignore[union-attr]
    assert final.model == "claude" and final.usage.input_tokens > 0
