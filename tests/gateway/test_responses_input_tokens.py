"""``POST /v1/responses/input_tokens`` and ``POST /v1/responses/compact`` with the openai SDK through the
real app: a deployment serving Responses itself gets the request as sent (its model name mapped, a
kept conversation put before the input in place of ``previous_response_id``, as ``create`` sends it);
a chat upstream's count is the gateway's estimate of the translated prompt, and it cannot compact (a
400 saying so). Neither is ever the 405 the ``/{response_id}`` routes answered a ``POST`` with."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import openai
import pytest

from backends.dev.echo_server import pieces
from backends.estimate import estimate_chat_prompt
from backends.openai_wire import ChatCompletionRequest
from gateway.app import create_app
from gateway.db import Database, migrate
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import sqlite_url  # noqa: F401
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_responses import INPUT_TOKENS, USAGE, FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread
from tests.support.usage_rows import usage_row


@pytest.fixture(scope="module")
def native_server() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def native(native_server: FakeResponsesUpstream) -> FakeResponsesUpstream:
    native_server.counted.clear()
    native_server.compacted.clear()
    return native_server


@pytest.fixture(scope="module")
def claude() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(sqlite_url: str, fake_upstream_server: FakeUpstream,
            native_server: FakeResponsesUpstream, claude: FakeAnthropic,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    migrate.upgrade(sqlite_url)
    anthropic = {"provider": "anthropic", "model": "claude-test", "api_base": claude.url, "api_key": "sk-claude"}
    chat = {"provider": "openai", "model": "upstream-echo", "api_base": fake_upstream_server.url, "api_key": "sk-up"}
    served = {"provider": "openai", "model": "up-model", "api_base": native_server.url, "api_key": "sk-native",
              "responses_api": True, "drop_params": ["x_dropped"]}
    settings = gateway_settings(fake_upstream_server.url, database={"url": sqlite_url},
                                usage={"journal_dir": str(tmp_path_factory.mktemp("journal"))},
                                models=[{"name": "echo", "deployments": [chat]},
                                        {"name": "native", "deployments": [served]},
                                        {"name": "claude", "deployments": [anthropic]}])
    with ServerThread(create_app(settings)) as server:
        yield server.url


@pytest.fixture
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=20)


def _post(gateway: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/responses/{path}", json=body, timeout=20,
                      headers={"authorization": f"Bearer {ADMIN_KEY}"})


TOOLS: Any = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


def test_a_native_deployment_counts_the_request_as_sent(client: openai.OpenAI, native: FakeResponsesUpstream) -> None:
    counted = client.responses.input_tokens.count(
        model="native", input=[{"role": "user", "content": "hello"}], instructions="be brief", tools=TOOLS,
        reasoning={"effort": "low"}, text={"format": {"type": "text"}}, truncation="auto",
        extra_body={"x_vendor": {"kept": [1, 2]}, "x_dropped": 1})
    assert counted.object == "response.input_tokens" and counted.input_tokens == INPUT_TOKENS
    assert native.counted == [{
        "model": "up-model", "input": [{"role": "user", "content": "hello"}], "instructions": "be brief",
        "tools": TOOLS, "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}}, "truncation": "auto",
        "x_vendor": {"kept": [1, 2]}}]


def test_a_native_count_continues_a_kept_conversation_as_create_would(
        client: openai.OpenAI, native: FakeResponsesUpstream) -> None:
    first = client.responses.create(model="native", input="my name is Ada")
    client.responses.input_tokens.count(model="native", input="what is my name?", previous_response_id=first.id)
    client.responses.create(model="native", input="what is my name?", previous_response_id=first.id)
    sent = native.counted[-1]
    assert "previous_response_id" not in sent and sent["input"][0]["content"][0]["text"] == "my name is Ada"
    assert sent["input"] == native.received[-1]["input"]


def test_a_chat_upstream_count_is_the_estimate_of_the_translated_prompt(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    first = client.responses.create(model="echo", input="my name is Ada")
    asked = len(upstream.received)
    counted = client.responses.input_tokens.count(model="echo", input="what is my name?", instructions="be brief",
                                                  previous_response_id=first.id)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "my name is Ada"},
                {"role": "assistant", "content": "my name is Ada"}, {"role": "user", "content": "what is my name?"}]
    chat = msgspec.convert({"model": "echo", "messages": messages}, ChatCompletionRequest)
    assert counted.input_tokens == estimate_chat_prompt(chat)
    assert len(upstream.received) == asked  # counting asks no upstream


def test_an_anthropic_deployment_counts_the_translated_prompt(client: openai.OpenAI, claude: FakeAnthropic) -> None:
    counted = client.responses.input_tokens.count(model="claude", input="one two three four", instructions="be brief")
    asked = claude.received[-1]
    assert asked["model"] == "claude-test" and asked["system"] == [{"type": "text", "text": "be brief"}]
    assert counted.input_tokens == len(pieces("one two three four"))


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "nope", "input": "x"}, 404, "model"),
    ({"input": "x"}, 400, "model"),
    ({"model": "echo", "input": 5}, 400, "input"),
    ({"model": "echo", "input": "x", "previous_response_id": "resp_unknown"}, 400, "previous_response_id"),
    ({"model": "native", "input": "x", "previous_response_id": "resp_unknown", "tools": "x"}, 400, "tools"),
])
def test_a_bad_count_request_is_an_openai_error_naming_its_field(
        gateway: str, native: FakeResponsesUpstream, body: dict[str, Any], status: int, param: str) -> None:
    answer = _post(gateway, "input_tokens", body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
    assert native.counted == []


def _row(db_url: str, request_id: str, timeout: float = 10) -> UsageRow:
    return asyncio.run(usage_row(Database.from_url(db_url), request_id, timeout))


def test_a_native_deployment_compacts_the_request_as_sent_and_is_metered_a_count_is_not(
        client: openai.OpenAI, native: FakeResponsesUpstream, sqlite_url: str) -> None:
    count = client.responses.input_tokens.with_raw_response.count(model="native", input="not metered")
    answer = client.responses.with_raw_response.compact(
        model="native", input=[{"role": "user", "content": "long talk"}], instructions="keep it",
        extra_body={"x_vendor": 1})
    compacted = answer.parse()
    assert compacted.object == "response.compaction" and compacted.output[-1].type == "compaction"
    assert compacted.usage.input_tokens == USAGE["input_tokens"]
    assert native.compacted == [{"model": "up-model", "input": [{"role": "user", "content": "long talk"}],
                                 "instructions": "keep it", "x_vendor": 1}]
    row = _row(sqlite_url, answer.headers["x-request-id"])
    assert (row.endpoint, row.model, row.prompt_tokens, row.completion_tokens) == ("responses.compact", "native", 7, 3)
    with pytest.raises(AssertionError):  # written before the compaction's row, were it metered
        _row(sqlite_url, count.headers["x-request-id"], timeout=0)


def test_a_chat_upstream_cannot_compact(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.compact(model="echo", input="long talk")
    assert "natively" in refused.value.message and refused.value.body["param"] == "model"  # type: ignore[index]
    assert upstream.received == []


def test_compacting_an_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.compact(model="nope", input="x")
    assert refused.value.code == "model_not_found"


def test_a_compaction_continues_a_kept_conversation_as_create_would(
        client: openai.OpenAI, native: FakeResponsesUpstream) -> None:
    first = client.responses.create(model="native", input="my name is Ada")
    compacted = client.responses.compact(model="native", input="and more", previous_response_id=first.id)
    sent = native.compacted[-1]
    assert "previous_response_id" not in sent
    assert [item["content"][0]["text"] for item in sent["input"] if item.get("role") == "user"] == [
        "my name is Ada", "and more"]
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]


def test_another_method_on_these_paths_is_an_openai_error(gateway: str) -> None:
    for method, path in (("GET", "input_tokens"), ("DELETE", "compact")):
        answer = httpx.request(method, f"{gateway}/v1/responses/{path}",
                               headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"
