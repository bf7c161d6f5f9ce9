"""No provider secret reaches a client through what an upstream says back on the error path: each
upstream here echoes the request's headers (the deployment's key among them) in its error words,
mid-stream as well as in whole answers, and what the official SDKs get holds none of the key."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from backends import redaction
from backends.config import DeploymentConfig
from backends.factory import build_backend
from gateway.app import create_app
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_responses import ECHO_ERROR_OBJECT, FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.servers import ServerThread

OPENAI_KEY = "sk-openai-relay-secret-0001"
ANTHROPIC_KEY = "sk-ant-relay-secret-0002"
RESPONSES_KEY = "sk-responses-relay-secret-0003"
KEYS = (OPENAI_KEY, ANTHROPIC_KEY, RESPONSES_KEY)


@pytest.fixture(scope="module")
def responses_upstream() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(fake_upstream_server: FakeUpstream, anthropic_upstream: FakeAnthropic,
            responses_upstream: FakeResponsesUpstream) -> Iterator[tuple[str, RecordingSink]]:
    def model(name: str, **deployment: Any) -> dict[str, Any]:
        return {"name": name, "max_retries": 0, "deployments": [deployment]}

    settings = parse_settings({"models": [
        model("chat", provider="openai", model="upstream-echo", api_base=fake_upstream_server.url, api_key=OPENAI_KEY),
        model("claude", provider="anthropic", model="claude-test", api_base=anthropic_upstream.url,
              api_key=ANTHROPIC_KEY),
        model("native", provider="openai", model="up-model", api_base=responses_upstream.url, api_key=RESPONSES_KEY,
              responses_api=True),
    ]}, env={})
    usage = RecordingSink()
    services = Services(authenticator=StaticKeys({ADMIN_KEY: Principal("admin", None, is_admin=True)}),
                        admission=ScriptedAdmission(), usage=usage,
                        router=Router.from_settings(settings, build_backend))
    with ServerThread(create_app(settings, services)) as server:
        yield server.url, usage


@pytest.fixture
def openai_client(gateway: tuple[str, RecordingSink], upstream: FakeUpstream,
                  anthropic_upstream: FakeAnthropic) -> openai.OpenAI:
    anthropic_upstream.faults.clear()
    anthropic_upstream.stream_faults.clear()
    gateway[1].records.clear()
    return openai.OpenAI(base_url=gateway[0] + "/v1", api_key=ADMIN_KEY, max_retries=0)


@pytest.fixture
def anthropic_client(openai_client: openai.OpenAI, gateway: tuple[str, RecordingSink]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway[0], api_key=ADMIN_KEY, max_retries=0)


def assert_no_key(*said: Any) -> None:
    for words in said:
        text = words if isinstance(words, str) else json.dumps(words, default=str)
        for key in KEYS:
            assert key not in text, text


def echoed(headers: dict[str, str]) -> str:
    return f"refused, you sent {headers}"


MESSAGES: list[Any] = [{"role": "user", "content": "a b c"}]


# ---------------------------------------------------------------- chat completions (openai upstream)


def _error_event(headers: dict[str, str]) -> dict[str, Any]:
    return {"error": {"message": echoed(headers), "type": "server_error", "code": "server_error"}}


def _error_on_a_chunk(headers: dict[str, str]) -> dict[str, Any]:
    """OpenRouter's failure mid-stream: a chunk with an ``error`` beside its fields, finish_reason "error"."""
    return {"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "error": {"code": "server_error", "message": echoed(headers)},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]}


@pytest.mark.parametrize("event", [_error_event, _error_on_a_chunk], ids=["error-event", "error-on-a-chunk"])
def test_an_error_mid_stream_echoing_the_key_is_redacted(openai_client: openai.OpenAI, upstream: FakeUpstream,
                                                         event: Callable[[dict[str, str]], dict[str, Any]]) -> None:
    upstream.fail_next(Fault(error_after_chunks=2, error_event=event))
    with pytest.raises(openai.APIError) as failed:  # the SDK raises the error an event or a chunk carries
        list(openai_client.chat.completions.create(model="chat", messages=MESSAGES, stream=True))
    assert redaction.MASK in failed.value.message
    assert_no_key(failed.value.message, failed.value.body)


def test_a_first_error_event_and_an_error_status_echoing_the_key_are_redacted(
        openai_client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(error_after_chunks=0, error_event=lambda h: {"error": {"message": echoed(h),
                                                                                  "code": 503}}),
                       Fault(status=503, body=lambda h: {"error": {"message": echoed(h), "type": "server_error"}}))
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as failed:
            list(openai_client.chat.completions.create(model="chat", messages=MESSAGES, stream=True))
        assert redaction.MASK in failed.value.message
        assert_no_key(failed.value.message, failed.value.body)


@pytest.mark.parametrize("status", [400, 422])
def test_the_param_and_code_of_an_error_echoing_the_key_are_redacted(openai_client: openai.OpenAI,
                                                                     upstream: FakeUpstream, status: int) -> None:
    """A 400's ``param`` and ``code`` are relayed to the client as its own: they are an upstream's words too."""
    upstream.fail_next(Fault(status=status, body=lambda h: {"error": {
        "message": "refused", "type": "invalid_request_error", "param": h.get("authorization"),
        "code": f"bad_key:{h.get('authorization')}"}}))
    with pytest.raises(openai.BadRequestError) as failed:
        openai_client.chat.completions.create(model="chat", messages=MESSAGES)
    assert failed.value.param is not None and redaction.MASK in failed.value.param
    assert failed.value.code is not None and redaction.MASK in failed.value.code
    assert_no_key(failed.value.message, failed.value.body)


def test_a_whole_answer_carrying_an_error_echoing_the_key_is_redacted(openai_client: openai.OpenAI,
                                                                      upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=200, body=lambda h: {
        "id": "chatcmpl-e", "object": "chat.completion", "created": 0, "model": "m",
        "error": {"message": echoed(h)},
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "error"}]}))
    answer = openai_client.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES)
    assert redaction.MASK in answer.text
    assert_no_key(answer.text)


# ---------------------------------------------------------------- /v1/messages and chat (anthropic upstream)


def test_an_anthropic_error_event_relayed_to_a_messages_stream_is_redacted(
        anthropic_client: anthropic.Anthropic, anthropic_upstream: FakeAnthropic) -> None:
    anthropic_upstream.fail_mid_stream_next("api_error")
    with anthropic_client.messages.with_streaming_response.create(
            model="claude", max_tokens=16, stream=True, messages=[{"role": "user", "content": "hi"}]) as streamed:
        said = streamed.read().decode()
    assert "event: error" in said and redaction.MASK in said
    assert_no_key(said)
    anthropic_upstream.fail_mid_stream_next("overloaded_error")
    with pytest.raises(anthropic.APIStatusError) as failed:  # the error is all the SDK sees
        list(anthropic_client.messages.create(model="claude", max_tokens=16, stream=True,
                                              messages=[{"role": "user", "content": "hi"}]))
    assert_no_key(failed.value.message, failed.value.body)


def test_an_anthropic_error_event_on_a_chat_stream_and_an_error_status_are_redacted(
        openai_client: openai.OpenAI, anthropic_upstream: FakeAnthropic,
        gateway: tuple[str, RecordingSink]) -> None:
    anthropic_upstream.fail_mid_stream_next("api_error")
    with pytest.raises(openai.APIError) as mid:
        list(openai_client.chat.completions.create(model="claude", messages=MESSAGES, stream=True))
    anthropic_upstream.fail_next(500, "api_error", "broke: {headers}")
    with pytest.raises(openai.InternalServerError) as status:
        openai_client.chat.completions.create(model="claude", messages=MESSAGES)
    for failed in (mid.value, status.value):
        assert redaction.MASK in failed.message
        assert_no_key(failed.message, failed.body)
    assert_no_key([vars(record) for record in gateway[1].records])


# ---------------------------------------------------------------- Responses passed through


def test_a_responses_error_object_answered_whole_is_a_failure_without_the_key(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as whole:  # was relayed as it came, as a response
        openai_client.responses.create(model="native", input=ECHO_ERROR_OBJECT, store=False)
    assert redaction.MASK in whole.value.message
    assert_no_key(whole.value.message, whole.value.body)


def test_a_responses_error_object_mid_stream_is_a_failure_without_the_key(openai_client: openai.OpenAI,
                                                                          gateway: tuple[str, RecordingSink]) -> None:
    with httpx.stream("POST", gateway[0] + "/v1/responses", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                      json={"model": "native", "input": ECHO_ERROR_OBJECT, "store": False, "stream": True},
                      timeout=20) as streamed:
        said = streamed.read().decode()
    assert "response.created" in said and "event: error" in said and redaction.MASK in said
    assert_no_key(said)


def test_every_string_of_a_failed_responses_error_object_is_redacted() -> None:
    redaction.register(RESPONSES_KEY)
    failed = {"status": "failed", "output": [{"text": f"an answer may say {RESPONSES_KEY}"}],
              "error": {"message": f"refused {RESPONSES_KEY}", "code": f"key:{RESPONSES_KEY}", "param": RESPONSES_KEY}}
    redaction.redact_failure(failed)
    assert failed["error"] == {"message": f"refused {redaction.MASK}", "code": f"key:{redaction.MASK}",
                               "param": redaction.MASK}
    assert failed["output"] == [{"text": f"an answer may say {RESPONSES_KEY}"}]  # an answer's words are its own


# ---------------------------------------------------------------- what is registered


def test_the_credentials_a_deployment_sends_in_its_headers_are_registered() -> None:
    redaction.register_headers({"authorization": "Bearer tok-from-authorization", "x-goog-api-key": "goog-key-123",
                                "api-key": "azure-key-4567", "x-session-token": "session-token-89",
                                "anthropic-version": "2023-06-01", "x-tenant": "tenant-name-long"})
    said = redaction.redact("tok-from-authorization goog-key-123 azure-key-4567 session-token-89 "
                            "2023-06-01 tenant-name-long")
    assert said == " ".join([redaction.MASK] * 4 + ["2023-06-01", "tenant-name-long"])


def test_a_deployment_registers_its_key_and_its_api_base_password_as_it_is_built() -> None:
    build_backend(DeploymentConfig(provider="anthropic", model="m", api_key="sk-ant-built-key-1",
                                   api_base="http://probe:base-password-2@127.0.0.1:9/v1"))
    assert redaction.redact("sk-ant-built-key-1 base-password-2") == f"{redaction.MASK} {redaction.MASK}"


def test_redact_json_masks_every_string_and_keeps_an_answer_without_a_secret_as_it_came() -> None:
    redaction.register("json-secret-value")
    clean = b'{"a": 1.50, "b": ["x"]}'
    assert redaction.redact_json(clean) is clean
    masked = json.loads(redaction.redact_json(b'{"error": {"message": "k=json-secret-value", "n": [1, '
                                              b'"json-secret-value"]}, "x": 2}'))
    assert masked == {"error": {"message": f"k={redaction.MASK}", "n": [1, redaction.MASK]}, "x": 2}


def test_every_string_of_a_relayed_responses_error_event_is_redacted() -> None:
    redaction.register(RESPONSES_KEY)
    event = {"type": "error", "code": f"key:{RESPONSES_KEY}", "message": f"refused {RESPONSES_KEY}", "param": None,
             "sequence_number": 3}
    assert redaction.redact_error_event(event) == event | {"code": f"key:{redaction.MASK}",
                                                           "message": f"refused {redaction.MASK}"}
