"""OpenAI's custom tools (GPT-5: free-form text input, optionally constrained by a grammar) through
the gateway: an ``openai`` (HTTP) upstream gets the tools, ``tool_choice`` and custom calls in history
as the client sent them, and its custom calls (whole and streamed) reach the ``openai`` SDK as they
came (issue: a 400 "Invalid enum value"). A backend that serves only function tools (the built-in
engine, the Anthropic translation) answers a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import openai
import pytest

from backends.anthropic_wire import to_messages_request
from backends.base import BadRequest, Meter, UntranslatableAnswer
from backends.estimate import bound_chat_prompt, generated_text
from backends.local import tools
from backends.local.wire import chat_messages
from backends.openai_wire import AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from gateway.dialects.anthropic import MessagesEvents, message_body
from gateway.dialects.responses import ResponsesEvents, response_object
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.conftest import ROUTES, GatewayEnv, served_by
from tests.gateway.test_nested_transparency import RawRecorder, recorder, up  # noqa: F401
from tests.support.doubles import RecordingSink, ScriptedAdmission
from tests.support.fake_upstream import Fault
from tests.support.scripted_gateway import scripted_gateway

# Spellings a re-encoding would change (spaces, a \u escape, key order): they must arrive as these bytes.
TOOLS = (
    b'[{"type": "custom", "custom": {"name": "code_exec", "description": "Runs caf\\u00e9 code",'
    b' "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}}},'
    b' {"custom": {"format": {"type": "text"}, "name": "notes"}, "type": "custom"},'
    b' {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]'
)
TOOL_CHOICE = b'{"type": "custom", "custom": {"name": "code_exec"}}'
ALLOWED = (b'{"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "custom",'
           b' "custom": {"name": "code_exec"}}]}}')
CALL = {"id": "call_1", "type": "custom", "custom": {"name": "code_exec", "input": "print(1)"}}
HISTORY: list[Any] = [
    {"role": "user", "content": "run it"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "1"},
]
ANSWER = {"id": "chatcmpl-c", "object": "chat.completion", "created": 1, "model": "upstream-echo",
          "choices": [{"index": 0, "finish_reason": "tool_calls",
                       "message": {"role": "assistant", "content": None, "tool_calls": [CALL]}}],
          "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
DELTAS = [{"index": 0, "id": "call_1", "type": "custom", "custom": {"name": "code_exec", "input": ""}},
          {"index": 0, "custom": {"input": "print("}}, {"index": 0, "custom": {"input": "1)"}}]


@pytest.fixture(scope="module")
def custom_env(recorder: RawRecorder) -> Iterator[GatewayEnv]:
    plain = {"max_retries": 0, "circuit": {"failures": 1_000_000}}
    settings = gateway_settings(recorder.url, models=[
        {"name": "echo", "deployments": [{"provider": "openai", "model": "upstream-echo", "api_base": recorder.url,
                                          "api_key": "sk-up"}], **plain},
        {"name": "claude", "deployments": [{"provider": "anthropic", "model": "claude-test", "api_base": recorder.url,
                                            "api_key": "sk-ant"}], **plain},
    ])
    admission, usage = ScriptedAdmission(), RecordingSink()
    with scripted_gateway(settings, admission=admission, usage=usage) as server:
        yield GatewayEnv(server, admission, usage)


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, custom_env: GatewayEnv) -> Iterator[str]:
    with served_by(custom_env, request.param) as served:
        yield served


@pytest.fixture
def client(custom_env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=custom_env.base_url, api_key=ADMIN_KEY, max_retries=0)


def _post(env: GatewayEnv, **fields: bytes) -> httpx.Response:
    body = b"{" + b", ".join(b'"' + k.encode() + b'": ' + v for k, v in fields.items()) + b"}"
    return httpx.post(env.server.url + "/v1/chat/completions", content=body, timeout=30,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"})


@pytest.mark.parametrize("choice", [TOOL_CHOICE, ALLOWED])
@pytest.mark.parametrize("stream", [False, True])
def test_custom_tools_reach_the_upstream_byte_for_byte(custom_env: GatewayEnv, up: RawRecorder, route: str,
                                                       choice: bytes, stream: bool) -> None:
    answer = _post(custom_env, model=b'"echo"', messages=b'[{"role": "user", "content": "hi"}]', tools=TOOLS,
                   tool_choice=choice, stream=b"true" if stream else b"false")
    assert answer.status_code == 200, answer.text
    got = up.last_fields()
    assert got["tools"] == TOOLS and got["tool_choice"] == choice


def test_a_custom_call_in_history_is_relayed(client: openai.OpenAI, up: RawRecorder, route: str) -> None:
    client.chat.completions.create(model="echo", messages=HISTORY, tools=json.loads(TOOLS))
    sent = json.loads(up.bodies[-1])
    assert sent["messages"] == HISTORY and sent["tools"] == json.loads(TOOLS)


def test_a_custom_call_answer_reaches_the_sdk(client: openai.OpenAI, up: RawRecorder, route: str) -> None:
    up.fail_next(Fault(status=200, body=ANSWER))
    reply = client.chat.completions.create(model="echo", messages=HISTORY, tools=json.loads(TOOLS))
    call: Any = (reply.choices[0].message.tool_calls or [])[0]
    assert call.type == "custom" and call.id == "call_1"
    assert call.custom.name == "code_exec" and call.custom.input == "print(1)"
    assert reply.choices[0].finish_reason == "tool_calls"


def test_streamed_custom_calls_reach_the_sdk(client: openai.OpenAI, up: RawRecorder, route: str) -> None:
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "upstream-echo"}
    events = [base | {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [d]},
                                   "finish_reason": None}]} for d in DELTAS]
    events.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    up.fail_next(Fault(status=200, body=body, headers={"content-type": "text/event-stream"}))
    stream = client.chat.completions.create(model="echo", messages=HISTORY, tools=json.loads(TOOLS), stream=True)
    deltas = [d.model_dump(exclude_unset=True) for chunk in stream if chunk.choices
              for d in chunk.choices[0].delta.tool_calls or []]
    assert deltas == DELTAS


def test_an_anthropic_deployment_names_the_custom_tool(custom_env: GatewayEnv, up: RawRecorder) -> None:
    answer = _post(custom_env, model=b'"claude"', messages=b'[{"role": "user", "content": "hi"}]', tools=TOOLS)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "tools[0].type" and error["type"] == "invalid_request_error"
    assert "anthropic" in error["message"] and "custom" in error["message"] and up.bodies == []


def _request(**fields: Any) -> ChatCompletionRequest:
    return msgspec.json.decode(json.dumps({"model": "m", **fields}), type=ChatCompletionRequest)


def test_the_anthropic_translation_names_a_custom_call_in_history() -> None:
    with pytest.raises(BadRequest) as caught:
        to_messages_request(_request(messages=HISTORY), "claude", stream=False)
    assert caught.value.param == "messages[1].tool_calls[0]"


def test_the_built_in_engine_names_custom_tools_and_calls() -> None:
    with pytest.raises(BadRequest) as caught:
        tools.plan(_request(messages=HISTORY[:1], tools=json.loads(TOOLS)), "auto")
    assert caught.value.param == "tools[0].type"
    with pytest.raises(BadRequest) as caught:
        chat_messages(_request(messages=HISTORY))
    assert caught.value.param == "messages[1].tool_calls[0]"


@pytest.mark.parametrize(("tool", "param"), [
    ({"type": "custom", "function": {"name": "f"}}, "tools[0].custom"),
    ({"type": "function", "custom": {"name": "f"}}, "tools[0].function"),
    ({"type": "mcp", "custom": {"name": "f"}}, "tools[0].type"),
])
def test_a_tool_without_the_object_its_type_names_is_a_400(custom_env: GatewayEnv, up: RawRecorder,
                                                           tool: dict[str, Any], param: str) -> None:
    answer = _post(custom_env, model=b'"echo"', messages=b'[{"role": "user", "content": "hi"}]',
                   tools=json.dumps([tool]).encode())
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param and up.bodies == []


def test_estimates_count_custom_tools_and_calls() -> None:
    plain = bound_chat_prompt(_request(messages=HISTORY[:1]))
    assert bound_chat_prompt(_request(messages=HISTORY[:1], tools=json.loads(TOOLS))) > plain + len(TOOLS) // 2
    chunk = msgspec.json.decode(json.dumps({"id": "c", "model": "m", "choices": [
        {"index": 0, "delta": {"tool_calls": DELTAS[1:]}}]}), type=ChatCompletionChunk)
    assert generated_text(chunk.choices[0].delta) == "print( 1)"
    message = msgspec.convert(ANSWER["choices"][0]["message"], type=AssistantMessage)  # type: ignore[index]
    assert generated_text(message) == "code_exec print(1)"


@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_a_translated_answer_with_a_custom_call_is_untranslatable(dialect: str) -> None:
    """A /v1/messages or /v1/responses answer translated from chat cannot hold a custom call: a 502."""
    whole = msgspec.convert(ANSWER, type=ChatCompletion)
    chunk = msgspec.json.decode(json.dumps({"id": "c", "model": "m", "choices": [
        {"index": 0, "delta": {"tool_calls": DELTAS[:1]}}]}), type=ChatCompletionChunk)
    events: Any = MessagesEvents() if dialect == "messages" else ResponsesEvents()
    with pytest.raises(UntranslatableAnswer, match="custom tool call"):
        message_body(whole, Meter()) if dialect == "messages" else response_object(whole)
    with pytest.raises(UntranslatableAnswer, match="'call_1'"):
        events.chunk(chunk)
