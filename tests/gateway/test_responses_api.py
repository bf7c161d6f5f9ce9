"""``POST /v1/responses`` with the official openai SDK as the client, translated via chat to an
OpenAI upstream (the loopback echo upstream)."""

from __future__ import annotations

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
    assert sent["max_tokens"] == 64 and sent["temperature"] == 0.2
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
