"""What a request to an Anthropic deployment opts into (anthropic-beta values, server tools, Files API
file_ids) goes upstream only when the deployment's config lists it; else a 400 in the route's error
shape naming it, before any upstream call. The anthropic and openai SDKs against a gateway on
loopback, and a loopback server speaking the Messages API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.settings import ConfigError, parse_settings
from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.servers import ServerThread

FILES = "files-api-2025-04-14"
LONG = "context-1m-2025-08-07"
SEARCH: Any = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
USER: Any = [{"role": "user", "content": "hi"}]
IMAGE_FILE = {"type": "image", "source": {"type": "file", "file_id": "file_other_tenant"}}


@pytest.fixture(scope="module")
def gateway(anthropic_upstream: FakeAnthropic) -> Iterator[ServerThread]:
    closed = {"provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url, "api_key": "sk"}
    opened = closed | {"name": "opened", "anthropic_betas": [FILES, LONG], "server_tools": ["web_search_20250305"]}
    with admin_gateway([
        {"name": "claude", "max_retries": 0, "deployments": [closed]},  # lists nothing: none allowed
        {"name": "claude-open", "max_retries": 0, "deployments": [opened]},
    ]) as server:
        yield server


@pytest.fixture
def upstream(anthropic_upstream: FakeAnthropic, gateway: ServerThread) -> FakeAnthropic:
    anthropic_upstream.received.clear()
    anthropic_upstream.headers.clear()
    return anthropic_upstream


@pytest.fixture
def ant(gateway: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=ADMIN_KEY, max_retries=0)


def _refused(call: Any, *names: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        call()
    body: Any = refused.value.body
    assert body["error"]["type"] == "invalid_request_error"
    for name in names:
        assert name in refused.value.message


# ---------------------------------------------------------------- anthropic-beta


def test_a_beta_the_deployment_does_not_list_is_refused(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    beta = {"anthropic-beta": LONG}
    _refused(lambda: ant.messages.create(model="claude", max_tokens=8, messages=USER, extra_headers=beta),
             "anthropic-beta", repr(LONG))
    _refused(lambda: ant.messages.stream(model="claude", max_tokens=8, messages=USER,
                                         extra_headers=beta).__enter__(), repr(LONG))
    _refused(lambda: ant.messages.count_tokens(model="claude", messages=USER, extra_headers=beta), repr(LONG))
    # one listed beta does not carry an unlisted one with it
    _refused(lambda: ant.messages.create(model="claude-open", max_tokens=8, messages=USER,
                                         extra_headers={"anthropic-beta": f"{LONG}, output-128k-2025-02-19"}),
             "'output-128k-2025-02-19'")
    assert upstream.received == []


def test_listed_betas_go_upstream_as_sent(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    header = f"{FILES}, {LONG}"
    ant.messages.create(model="claude-open", max_tokens=8, messages=USER, extra_headers={"anthropic-beta": header})
    assert upstream.headers[-1]["anthropic-beta"] == header
    ant.messages.create(model="claude", max_tokens=8, messages=USER)  # no beta: nothing to allow
    assert "anthropic-beta" not in upstream.headers[-1]


def test_the_refusal_has_anthropics_error_shape(gateway: ServerThread, upstream: FakeAnthropic) -> None:
    response = httpx.post(gateway.url + "/v1/messages", json={"model": "claude", "max_tokens": 8, "messages": USER},
                          headers={"x-api-key": ADMIN_KEY, "anthropic-beta": LONG})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert LONG in body["error"]["message"] and "anthropic_betas" in body["error"]["message"]


# ---------------------------------------------------------------- server tools


def test_a_server_tool_the_deployment_does_not_list_is_refused(ant: anthropic.Anthropic,
                                                              upstream: FakeAnthropic) -> None:
    client_tool: Any = {"name": "f", "input_schema": {"type": "object"}}
    _refused(lambda: ant.messages.create(model="claude", max_tokens=8, messages=USER,
                                         tools=[client_tool, SEARCH]), "tools[1].type", "'web_search_20250305'")
    code: Any = {"type": "code_execution_20250522", "name": "code_execution"}
    _refused(lambda: ant.messages.create(model="claude-open", max_tokens=8, messages=USER,
                                         tools=[SEARCH, code]), "tools[1].type", "'code_execution_20250522'")
    _refused(lambda: ant.messages.count_tokens(model="claude", messages=USER, tools=[SEARCH]), "tools[0].type")
    assert upstream.received == []


def test_client_tools_and_listed_server_tools_go_upstream(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    tools: Any = [{"name": "f", "input_schema": {"type": "object"}},
                  {"type": "custom", "name": "g", "input_schema": {"type": "object"}}]
    ant.messages.create(model="claude", max_tokens=8, messages=USER, tools=tools)
    assert upstream.received[-1]["tools"] == tools
    ant.messages.create(model="claude-open", max_tokens=8, messages=USER, tools=[*tools, SEARCH])
    assert upstream.received[-1]["tools"] == [*tools, SEARCH]


# ---------------------------------------------------------------- Files API references


FILE_REFERENCES: dict[str, tuple[Any, str]] = {
    "an image from the Files API": (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, IMAGE_FILE]}]},
        "messages[0].content[1]"),
    "a document in a tool result": (
        {"messages": [{"role": "user", "content": "x"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                          {"type": "document", "source": {"type": "file", "file_id": "file_x"}}]}]}],
         "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
        "messages[2].content[0].content[0].source"),
    "a container upload": (
        {"messages": [{"role": "user", "content": [{"type": "container_upload", "file_id": "file_x"},
                                                   {"type": "text", "text": "run it"}]}]},
        "messages[0].content[0]"),
    "a system prompt block": (
        {"messages": USER, "system": [{"type": "text", "text": "s"},
                                      {"type": "document", "source": {"type": "file", "file_id": "file_x"}}]},
        "system[1].source"),
}


@pytest.mark.parametrize("case", list(FILE_REFERENCES))
def test_a_file_id_needs_the_files_api_beta_listed(ant: anthropic.Anthropic, upstream: FakeAnthropic,
                                                   case: str) -> None:
    body, where = FILE_REFERENCES[case]
    _refused(lambda: ant.messages.create(model="claude", max_tokens=8, **body), where, FILES)
    _refused(lambda: ant.messages.count_tokens(model="claude", **body), where)
    assert upstream.received == []
    ant.messages.create(model="claude-open", max_tokens=8, **body)
    assert upstream.received[-1] == {"model": "claude-test", "max_tokens": 8} | body


def test_a_file_id_among_a_tool_calls_arguments_is_the_clients_own(ant: anthropic.Anthropic,
                                                                   upstream: FakeAnthropic) -> None:
    messages: Any = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                   "input": {"file_id": "mine"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]
    ant.messages.create(model="claude", max_tokens=8, messages=messages,
                        tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert upstream.received[-1]["messages"] == messages
    chat = openai.OpenAI(base_url=str(ant.base_url).rstrip("/") + "/v1", api_key=ADMIN_KEY, max_retries=0)
    chat.chat.completions.create(model="claude", messages=[  # an OpenAI client's call, translated
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "t", "type": "function",
                                              "function": {"name": "f", "arguments": '{"file_id": "mine"}'}}]},
        {"role": "tool", "tool_call_id": "t", "content": "ok"}])
    assert upstream.received[-1]["messages"][1]["content"][0]["input"] == {"file_id": "mine"}


def test_a_cited_answer_replayed_is_no_file_reference(ant: anthropic.Anthropic, upstream: FakeAnthropic) -> None:
    """An earlier answer's citations of a plain-text document carry ``"file_id": null`` (the SDK's
    model of them dumps it): a conversation that replays the answer references no file."""
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The sky."},
                "citations": {"enabled": True}}
    cited = {"type": "char_location", "cited_text": "The sky.", "document_index": 0, "document_title": None,
             "start_char_index": 0, "end_char_index": 8, "file_id": None}
    messages: Any = [{"role": "user", "content": [document, {"type": "text", "text": "What colour?"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": "Blue.", "citations": [cited]}]},
                     {"role": "user", "content": "Sure?"}]
    ant.messages.create(model="claude", max_tokens=8, messages=messages)
    assert upstream.received[-1]["messages"] == messages


# ---------------------------------------------------------------- config


def _deployment(**fields: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "deployments": [{"provider": "anthropic", "model": "c", **fields}]}]}


@pytest.mark.parametrize("fields, problem", [
    ({"anthropic_beta": [FILES]}, "anthropic_beta"),  # a typo of anthropic_betas
    ({"anthropic_betas": FILES}, "anthropic_betas"),  # not a list
    ({"server_tools": [5]}, r"server_tools\[0\]"),
    ({"anthropic_betas": [f"{FILES},{LONG}"]}, r"anthropic_betas\[0\]"),  # one beta per entry
    ({"server_tools": [""]}, r"server_tools\[0\]"),
])
def test_a_bad_allow_list_fails_config_load(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_settings(_deployment(**fields), env={})


def test_allow_lists_belong_to_anthropic_deployments_only() -> None:
    raw = {"models": [{"name": "m", "deployments": [{"provider": "openai", "model": "c",
                                                      "server_tools": ["web_search_20250305"]}]}]}
    with pytest.raises(ConfigError, match="anthropic deployments only"):
        parse_settings(raw, env={})
    deployment = parse_settings(_deployment(anthropic_betas=[FILES]), env={}).models[0].deployments[0]
    assert deployment.anthropic_betas == [FILES] and deployment.server_tools == []
