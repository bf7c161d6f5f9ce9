"""OpenAI chat fields the Messages API has no equivalent for, sent to an ``anthropic`` deployment:
a 400 naming the field (never dropped silently), unless the value changes nothing or the
deployment's ``drop_params`` lists it; ``parallel_tool_calls: false`` is mapped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.scripted_gateway import scripted_gateway

HELLO = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(upstream: FakeAnthropic) -> Iterator[openai.OpenAI]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": upstream.url, "api_key": "sk-ant"}
    settings = parse_settings({"models": [
        {"name": "claude", "max_retries": 0, "deployments": [deployment]},
        {"name": "lenient", "max_retries": 0,
         "deployments": [deployment | {"drop_params": ["seed", "response_format"]}]},
    ]}, env={})
    with scripted_gateway(settings) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)


@pytest.mark.parametrize(("field", "value"), [
    ("seed", 7), ("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("logit_bias", {"50256": -100}),
    ("logprobs", True), ("top_logprobs", 2), ("min_p", 0.1), ("repetition_penalty", 1.2), ("min_tokens", 3),
    ("guided_json", {"type": "object"}), ("chat_template_kwargs", {"enable_thinking": False}),
])
def test_a_field_anthropic_cannot_honour_is_a_400_naming_it(client: openai.OpenAI, upstream: FakeAnthropic,
                                                            field: str, value: Any) -> None:
    upstream.received.clear()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="claude", messages=HELLO, extra_body={field: value})  # type: ignore[arg-type]
    assert err.value.param == field and field in err.value.message
    assert upstream.received == []  # refused before any request went upstream


def test_a_temperature_above_anthropics_range_is_a_400_naming_it(client: openai.OpenAI,
                                                                  upstream: FakeAnthropic) -> None:
    """OpenAI's temperature goes to 2, Anthropic's to 1: refused, never capped."""
    upstream.received.clear()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="claude", messages=HELLO, temperature=1.5)  # type: ignore[arg-type]
    assert err.value.param == "temperature" and "temperature" in err.value.message
    client.chat.completions.create(model="claude", messages=HELLO, temperature=1)  # type: ignore[arg-type]
    assert [sent["temperature"] for sent in upstream.received] == [1]


@pytest.mark.parametrize(("field", "value"), [
    ("seed", 7), ("n", 2), ("presence_penalty", 0.5), ("logprobs", 2), ("echo", True), ("suffix", "end"),
    ("best_of", 2), ("logit_bias", {"50256": -100}), ("reasoning_effort", "turbo"),
])
def test_a_text_completion_field_anthropic_cannot_honour_is_a_400_naming_it(
        client: openai.OpenAI, upstream: FakeAnthropic, field: str, value: Any) -> None:
    """/v1/completions served as a chat: no field is dropped on the way."""
    upstream.received.clear()
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="claude", prompt="hello", extra_body={field: value})
    assert err.value.param == field and field in err.value.message
    assert upstream.received == []


def test_values_that_change_nothing_are_accepted(client: openai.OpenAI, upstream: FakeAnthropic) -> None:
    """What SDK wrappers send by default does not make every request fail."""
    upstream.received.clear()
    client.chat.completions.create(
        model="claude", messages=HELLO, presence_penalty=0, frequency_penalty=0.0, logprobs=False, logit_bias={},
        response_format={"type": "text"}, extra_body={"repetition_penalty": 1.0, "min_p": 0})  # type: ignore[arg-type]
    sent = upstream.received[-1]
    assert not {"presence_penalty", "frequency_penalty", "logprobs", "logit_bias", "response_format"} & set(sent)


def test_drop_params_lets_a_deployment_ignore_what_anthropic_cannot_do(client: openai.OpenAI,
                                                                      upstream: FakeAnthropic) -> None:
    upstream.received.clear()
    client.chat.completions.create(model="lenient", messages=HELLO, seed=3, response_format={"type": "json_object"})
    sent = upstream.received[-1]
    assert not {"seed", "response_format", "tools", "tool_choice"} & set(sent)


def test_parallel_tool_calls_false_disables_parallel_tool_use(client: openai.OpenAI, upstream: FakeAnthropic) -> None:
    upstream.received.clear()
    client.chat.completions.create(model="claude", messages=HELLO, tools=TOOLS, parallel_tool_calls=False)  # type: ignore[arg-type]
    assert upstream.received[-1]["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    client.chat.completions.create(model="claude", messages=HELLO, tools=TOOLS, parallel_tool_calls=False,  # type: ignore[arg-type]
                                   tool_choice={"type": "function", "function": {"name": "search"}})
    assert upstream.received[-1]["tool_choice"] == {"type": "tool", "name": "search", "disable_parallel_tool_use": True}


def test_a_translated_responses_request_keeps_its_metadata_and_parallel_tool_calls(
        client: openai.OpenAI, upstream: FakeAnthropic) -> None:
    """``/v1/responses`` to an anthropic deployment: ``parallel_tool_calls: false`` is mapped as
    chat's is, and ``metadata`` (the response's own) is reported back, not sent to Anthropic, whose
    ``metadata`` takes only ``user_id``."""
    upstream.received.clear()
    tools = [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}]
    response = client.responses.create(model="claude", input="hello", tools=tools,  # type: ignore[arg-type]
                                       parallel_tool_calls=False, metadata={"k": "v"}, store=False)
    assert response.status == "completed" and response.metadata == {"k": "v"}
    sent = upstream.received[-1]
    assert sent["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True} and "metadata" not in sent


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_strict_function_tool_stays_strict(client: openai.OpenAI, upstream: FakeAnthropic, stream: bool) -> None:
    """``strict: true`` is Anthropic's strict tool use (generally available: no beta header), so the
    schema the client believes enforced is; ``strict: false`` or none sends nothing, as before."""
    upstream.received.clear()
    upstream.headers.clear()
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
              "additionalProperties": False}
    tools: Any = [{"type": "function", "function": {"name": f"f{i}", "parameters": schema} | strict}
                  for i, strict in enumerate([{"strict": True}, {"strict": False}, {}])]
    answer = client.chat.completions.create(model="claude", messages=HELLO, tools=tools, stream=stream)
    if stream:
        list(answer)  # type: ignore[arg-type]
    sent = upstream.received[-1]["tools"]
    assert [t.get("strict") for t in sent] == [True, None, None]
    assert sent[0] == {"name": "f0", "description": "", "input_schema": schema, "strict": True}
    assert "anthropic-beta" not in upstream.headers[-1]
