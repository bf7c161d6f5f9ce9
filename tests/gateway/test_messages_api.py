"""``POST /v1/messages`` with the official anthropic SDK as the client, routed to an OpenAI upstream."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream, Fault


@pytest.fixture
def client(env: GatewayEnv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.server.url, api_key=ADMIN_KEY, max_retries=0)


def test_message_round_trip(client: anthropic.Anthropic, upstream: FakeUpstream, env: GatewayEnv) -> None:
    message = client.messages.create(
        model="echo", max_tokens=64, system="be brief", stop_sequences=["END"], extra_body={"temperature": 0.2},
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello from anthropic"}]}],
    )
    assert message.content[0].type == "text" and message.content[0].text == "hello from anthropic"
    assert message.stop_reason == "end_turn" and message.role == "assistant"
    assert message.usage.output_tokens == 3
    assert message.id.startswith("msg_") and "chatcmpl" not in message.id  # Anthropic's id form
    sent = upstream.last.json
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["max_tokens"] == 64 and sent["stop"] == ["END"] and sent["temperature"] == 0.2
    assert env.usage.wait_for(1)[0].endpoint == "messages"


def test_max_tokens_stop_reason(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="echo", max_tokens=1, messages=[{"role": "user", "content": "a b c"}])
    assert message.stop_reason == "max_tokens"


def test_message_stream(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="echo", max_tokens=64,
                                messages=[{"role": "user", "content": "streamed words here"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed words here"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3
    assert final.id.startswith("msg_") and "chatcmpl" not in final.id


def test_tool_results_are_translated(client: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    client.messages.create(
        model="echo", max_tokens=10,
        tools=[{"name": "lookup", "description": "d", "input_schema": {"type": "object", "properties": {}}}],
        tool_choice={"type": "any"},
        messages=[
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                                         {"type": "text", "text": "and then?"}]},
        ])
    sent = upstream.last.json
    assert sent["tool_choice"] == "required" and sent["tools"][0]["function"]["name"] == "lookup"
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool", "user"]
    assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q":1}'}
    assert sent["messages"][2] == {"role": "tool", "content": "42", "tool_call_id": "t1"}


def test_errors_reach_the_sdk_typed(client: anthropic.Anthropic, env: GatewayEnv, upstream: FakeUpstream) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="echo", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    bad = anthropic.Anthropic(base_url=env.server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="echo", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    upstream.fail_next(Fault(status=429, headers={"retry-after": "2"}))
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="echo", max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_a_timeout_is_a_timeout_error(env: GatewayEnv, upstream: FakeUpstream) -> None:
    """A gateway timeout (504) has Anthropic's type for it, ``timeout_error``."""
    upstream.fail_next(Fault(status=408))  # the upstream timed out: the gateway's 504
    response = httpx.post(env.server.url + "/v1/messages", headers={"x-api-key": ADMIN_KEY},
                          json={"model": "echo", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 504
    assert response.json() == {"type": "error", "error": {"type": "timeout_error", "message": "injected 408"}}


def test_malformed_messages_body_is_400(env: GatewayEnv) -> None:
    response = httpx.post(env.server.url + "/v1/messages", headers={"x-api-key": ADMIN_KEY},
                          content=b'{"model": "echo", "max_tokens": 5, "messages": [{"role": "system"}]}')
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages[0].role" in body["error"]["message"]
    unauthenticated = httpx.post(env.server.url + "/v1/messages", content=b"{}")
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"]["type"] == "authentication_error"


def test_fuzzed_messages_bodies_never_5xx(env: GatewayEnv) -> None:
    import json
    import random

    rng = random.Random(7)
    values = [None, 0, -1, 1.5, "", "x", [], {}, [{"type": "text"}], [{"type": "image", "source": {}}],
              {"role": "user"}, [{"role": "user", "content": [{"type": "tool_result"}]}]]
    keys = ["model", "max_tokens", "messages", "system", "temperature", "top_k", "stop_sequences", "stream",
            "tools", "tool_choice", "metadata"]
    with httpx.Client(base_url=env.server.url, headers={"x-api-key": ADMIN_KEY}, timeout=10) as http:
        for _ in range(60):
            doc = {"model": "echo", "max_tokens": 3, "messages": [{"role": "user", "content": "fuzz"}]}
            for _ in range(rng.randrange(1, 4)):
                doc[rng.choice(keys)] = rng.choice(values)
            response = http.post("/v1/messages", content=json.dumps(doc))
            assert response.status_code < 500, (doc, response.text)


def test_the_request_id_is_where_the_anthropic_sdk_reads_it(client: anthropic.Anthropic, env: GatewayEnv) -> None:
    """Anthropic names it ``request-id``: the SDK's ``_request_id`` of an answer (whole or streamed) and
    ``request_id`` of an error are the gateway's id (its ``x-request-id``, the usage row's)."""
    raw = client.messages.with_raw_response.create(model="echo", max_tokens=5,
                                                   messages=[{"role": "user", "content": "x"}])
    assert raw.request_id and raw.request_id == raw.headers["x-request-id"]
    assert raw.parse()._request_id == raw.request_id
    with client.messages.stream(model="echo", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as stream:
        assert stream.request_id and stream.request_id == stream.response.headers["x-request-id"]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="echo", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert refused.value.request_id == refused.value.response.headers["x-request-id"]
    counted = client.messages.with_raw_response.count_tokens(model="echo", messages=[{"role": "user", "content": "x"}])
    assert counted.request_id == counted.headers["x-request-id"]
    unknown = httpx.post(env.server.url + "/v1/messages/nope", headers={"x-api-key": ADMIN_KEY}, json={})
    assert unknown.status_code == 404 and unknown.headers["request-id"] == unknown.headers["x-request-id"]
    chat = httpx.post(env.server.url + "/v1/chat/completions", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                      json={"model": "echo", "messages": [{"role": "user", "content": "x"}]})
    assert "request-id" not in chat.headers  # OpenAI's surface keeps its own name alone
