"""Transparency at every depth: an ``openai`` (HTTP) upstream gets the client's own JSON for every
field the gateway does not own, nested fields the gateway does not model included, byte for byte
(issue: pass-through was top-level only), and content part types the gateway does not model for
its own use (``refusal``, vLLM's ``video_url``) are accepted. The upstream records the raw bytes
it receives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import openai
import pytest

from backends.anthropic_wire import to_messages_request
from backends.base import BadRequest
from backends.dev.echo_server import Exchange
from backends.local.wire import chat_messages
from backends.openai_wire import ChatCompletionRequest
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.conftest import ROUTES, GatewayEnv, served_by
from tests.support.doubles import RecordingSink, ScriptedAdmission
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway

# Nested fields the gateway does not model, in spellings a re-encoding would change (an exponent,
# \u escapes, spaces, key order): they must arrive as these bytes.
MESSAGES = (
    b'[{"role": "system", "content": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]},'
    b' {"role": "user", "content": [{"type": "text", "text": "caf\\u00e9"},'
    b' {"type": "image_url", "image_url": {"url": "http://x/a.png", "uuid": "img-1", "detail": "low"}}]},'
    b' {"role": "assistant", "content": "hello", "reasoning_content": "thinking...", "z_first": 1.0e0},'
    b' {"role": "assistant", "content": null, "audio": {"id": "audio_abc"},'
    b' "function_call": {"name": "f", "arguments": "{}"}},'
    b' {"role": "user", "content": "again"}]'
)
TOOLS = (
    b'[{"type": "function", "extra_tool": 2, "function": {"name": "f", "parameters": {"type": "object"},'
    b' "extra_fn": true}}]'
)
RESPONSE_FORMAT = b'{"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "extra_js": 1}}'
OWNED = {"model", "stream", "stream_options", "max_completion_tokens"}


class RawRecorder(FakeUpstream):
    """The fake upstream, keeping each request's body as the bytes that came."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    async def handle(self, ex: Exchange) -> None:
        self.bodies.append(ex.body)
        await super().handle(ex)

    def last_fields(self) -> dict[str, bytes]:
        """The last body's top-level fields, each as its raw JSON bytes."""
        fields = msgspec.json.decode(self.bodies[-1], type=dict[str, msgspec.Raw])
        return {name: bytes(value) for name, value in fields.items()}


@pytest.fixture(scope="module")
def recorder() -> Iterator[RawRecorder]:
    upstream = RawRecorder().start()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def nested_env(recorder: RawRecorder) -> Iterator[GatewayEnv]:
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": recorder.url, "api_key": "sk-up",
                  "timeouts": {"connect": 2, "first_byte": 5, "total": 10}}
    plain = {"max_retries": 0, "circuit": {"failures": 1_000_000}}
    settings = gateway_settings(recorder.url, models=[
        {"name": "echo", "deployments": [deployment], **plain},
        {"name": "trimmed", "deployments": [deployment | {"name": "trimmed-dep", "drop_params": ["store"],
                                                          "rename_params": {"max_completion_tokens": "max_tokens"}}],
         **plain},
    ])
    admission, usage = ScriptedAdmission(), RecordingSink()
    with scripted_gateway(settings, admission=admission, usage=usage) as server:
        yield GatewayEnv(server, admission, usage)


@pytest.fixture
def up(recorder: RawRecorder) -> RawRecorder:
    recorder.reset()
    recorder.bodies.clear()
    return recorder


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, nested_env: GatewayEnv) -> Iterator[str]:
    """Each test on the direct route (gateway.fast_routes) and on Litestar's."""
    with served_by(nested_env, request.param) as served:
        yield served


@pytest.fixture
def client(nested_env: GatewayEnv) -> openai.OpenAI:
    return openai.OpenAI(base_url=nested_env.base_url, api_key=ADMIN_KEY, max_retries=0)


def _post(env: GatewayEnv, body: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(env.server.url + path, content=body, timeout=30,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"})


def _body(**fields: bytes) -> bytes:
    return b"{" + b", ".join(b'"' + k.encode() + b'": ' + v for k, v in fields.items()) + b"}"


@pytest.mark.parametrize("stream", [False, True])
def test_nested_fields_arrive_byte_for_byte(nested_env: GatewayEnv, up: RawRecorder, route: str,
                                            stream: bool) -> None:
    sent = {"model": b'"echo"', "messages": MESSAGES, "tools": TOOLS, "response_format": RESPONSE_FORMAT,
            "max_tokens": b"7", "temperature": b"0.5e0", "metadata": b'{"b": 1, "a": "\\u00e9"}',
            "stream": b"true" if stream else b"false"}
    answer = _post(nested_env, _body(**sent))
    assert answer.status_code == 200, answer.text
    got = up.last_fields()
    for name, raw in sent.items():
        if name not in OWNED:
            assert got[name] == raw, name
    assert json.loads(got["model"]) == "upstream-echo"
    if stream:
        assert got["stream"] == b"true" and json.loads(got["stream_options"]) == {"include_usage": True}
    else:
        assert "stream" not in got and "stream_options" not in got


def test_nested_fields_through_the_sdk(client: openai.OpenAI, up: RawRecorder, route: str) -> None:
    messages: Any = json.loads(MESSAGES)
    tools: Any = json.loads(TOOLS)
    client.chat.completions.create(model="echo", messages=messages, tools=tools,
                                   response_format=json.loads(RESPONSE_FORMAT), max_completion_tokens=9)
    sent = json.loads(up.bodies[-1])
    assert sent["messages"] == messages and sent["tools"] == tools
    assert sent["response_format"]["json_schema"]["extra_js"] == 1
    assert sent["messages"][2]["reasoning_content"] == "thinking..."
    assert sent["messages"][3]["audio"] == {"id": "audio_abc"} and sent["messages"][3]["function_call"]["name"] == "f"
    assert sent["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert sent["messages"][1]["content"][1]["image_url"]["uuid"] == "img-1"
    assert sent["max_completion_tokens"] == 9


def test_owned_fields_still_set(nested_env: GatewayEnv, up: RawRecorder) -> None:
    """With no limit from the client the upstream gets the gateway's cap; drop/rename_params apply."""
    answer = _post(nested_env, _body(model=b'"echo"', messages=MESSAGES, max_tokens=b"null"))
    assert answer.status_code == 200, answer.text
    got = up.last_fields()
    assert got["messages"] == MESSAGES and got["max_tokens"] == b"null"
    assert json.loads(got["max_completion_tokens"]) == 1024  # quotas.default_max_tokens
    answer = _post(nested_env, _body(model=b'"trimmed"', messages=MESSAGES, store=b"true",
                                     max_completion_tokens=b"3", tools=TOOLS))
    assert answer.status_code == 200, answer.text
    got = up.last_fields()
    assert "store" not in got and "max_completion_tokens" not in got and got["max_tokens"] == b"3"
    assert got["messages"] == MESSAGES and got["tools"] == TOOLS


def test_completions_keep_client_bytes(nested_env: GatewayEnv, up: RawRecorder, route: str) -> None:
    bias = b'{"50256": -1e2}'
    answer = _post(nested_env, _body(model=b'"echo"', prompt=b'"hi"', logit_bias=bias,
                                     stream_options=b'{"include_usage": true}', stream=b"true"), "/v1/completions")
    assert answer.status_code == 200, answer.text
    got = up.last_fields()
    assert got["logit_bias"] == bias and got["prompt"] == b'"hi"'
    assert json.loads(got["stream_options"]) == {"include_usage": True}


def test_stream_options_keep_the_clients_own_keys(nested_env: GatewayEnv, up: RawRecorder) -> None:
    """Usage is always asked for upstream; the client's other stream options (vLLM's) go too."""
    answer = _post(nested_env, _body(model=b'"echo"', messages=b'[{"role": "user", "content": "hi"}]', stream=b"true",
                                     stream_options=b'{"continuous_usage_stats": true}'))
    assert answer.status_code == 200, answer.text
    assert json.loads(up.last_fields()["stream_options"]) == {"continuous_usage_stats": True, "include_usage": True}
    chunks = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    # as vLLM: continuous usage only with include_usage, so no chunk carries usage (nor the closing usage chunk)
    assert chunks and all(c["choices"] and "usage" not in c for c in chunks)


def test_embeddings_keep_every_field_the_client_sent(nested_env: GatewayEnv, up: RawRecorder) -> None:
    """Fields of other providers' embedding APIs (input_type, truncate) reach the upstream as sent."""
    answer = _post(nested_env, _body(model=b'"echo"', input=b'["caf\\u00e9"]', input_type=b'"query"',
                                     truncate=b'{"side": "END"}', encoding_format=b'"float"'), "/v1/embeddings")
    assert answer.status_code == 200, answer.text
    got = up.last_fields()
    assert got["input"] == b'["caf\\u00e9"]' and got["input_type"] == b'"query"'
    assert got["truncate"] == b'{"side": "END"}' and got["model"] == b'"upstream-echo"'


def test_refusal_and_video_parts_reach_an_http_upstream(client: openai.OpenAI, up: RawRecorder, route: str) -> None:
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "video_url", "video_url": {"url": "http://x/v.mp4", "fps": 2}}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
        {"role": "user", "content": "ok"},
    ]
    reply = client.chat.completions.create(model="echo", messages=messages)
    assert reply.choices[0].message.content == "ok"
    assert json.loads(up.bodies[-1])["messages"] == messages


def test_bad_video_part_is_400(client: openai.OpenAI, up: RawRecorder) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="echo", messages=[  # type: ignore[list-item, misc]
            {"role": "user", "content": [{"type": "video_url", "video_url": {"link": "x"}}]}])
    assert caught.value.body["param"] == "messages[0].content[0].video_url.url"  # type: ignore[index]
    assert up.bodies == []


def _chat_request(*messages: dict[str, Any]) -> ChatCompletionRequest:
    return msgspec.json.decode(json.dumps({"model": "m", "messages": list(messages)}), type=ChatCompletionRequest)


VIDEO = {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}]}
REFUSAL = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}


@pytest.mark.parametrize("message", [VIDEO, REFUSAL])
def test_built_in_engine_refuses_the_new_parts(message: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as caught:
        chat_messages(_chat_request({"role": "user", "content": "a"}, message))
    assert caught.value.param == "messages[1].content"


def test_anthropic_maps_an_assistant_refusal_to_text() -> None:
    request = _chat_request({"role": "user", "content": "a"}, REFUSAL, {"role": "user", "content": "b"})
    body = to_messages_request(request, "claude", stream=False)
    assert body["messages"][1]["content"] == [{"type": "text", "text": "I can't help with that."}]


@pytest.mark.parametrize(("message", "named"), [
    (VIDEO, "'video_url'"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]},
     "'input_audio'"),
    ({"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}, "'refusal'"),
])
def test_anthropic_names_the_part_it_cannot_take(message: dict[str, Any], named: str) -> None:
    with pytest.raises(BadRequest) as caught:
        to_messages_request(_chat_request(message), "claude", stream=False)
    assert named in caught.value.message and "audio input" not in caught.value.message
    assert caught.value.param == "messages"
