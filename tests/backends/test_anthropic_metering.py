"""Metering an Anthropic deployment's answers where its usage is missing or the stream is cut short:
exact where Anthropic reported a count, an estimate (marked inexact) where it did not. The openai
SDK against a gateway on loopback and a loopback server speaking the Messages API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from backends.estimate import estimate_text
from gateway.contracts import UsageRecord
from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import ScriptedAnthropic

PROMPT = "count every word of this prompt"
THINKING = "first weigh each of the options with care, then pick the cheapest of them all " * 4
ARGUMENTS = '{"city": "Paris", "days": 7, "units": "metric", "detail": "hourly forecast with wind"}'


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedAnthropic]:
    server = ScriptedAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def usage() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def client(scripted: ScriptedAnthropic, usage: RecordingSink) -> Iterator[openai.OpenAI]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": scripted.url, "api_key": "sk"}
    with admin_gateway([{"name": "claude", "max_retries": 0, "deployments": [deployment]}], usage=usage) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def _record(usage: RecordingSink, before: int) -> UsageRecord:
    return usage.wait_for(before + 1)[before]


START = ("message_start", {"message": {"id": "msg_s", "type": "message", "role": "assistant", "model": "claude-test",
                                       "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}})
REASONED_CALL: list[tuple[str, dict[str, Any]]] = [
    ("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": THINKING}}),
    ("content_block_stop", {"index": 0}),
    ("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather",
                                                           "input": {}}}),
    ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ARGUMENTS[:30]}}),
    ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ARGUMENTS[30:]}}),
    ("content_block_stop", {"index": 1}),
]
MESSAGE_DELTA = ("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                   "usage": {"output_tokens": 42}})


def _stream(client: openai.OpenAI) -> None:
    list(client.chat.completions.create(model="claude", messages=[{"role": "user", "content": PROMPT}], stream=True))


def test_a_stream_cut_short_estimates_its_thinking_and_tool_input(
        client: openai.OpenAI, scripted: ScriptedAnthropic, usage: RecordingSink) -> None:
    """No message_delta came: the completion is estimated from every delta's text, not the text deltas alone."""
    before = len(usage.records)
    scripted.script = [START, *REASONED_CALL]
    with pytest.raises(openai.APIError):
        _stream(client)
    record = _record(usage, before)
    assert record.extra == {"outcome": "failed"} and not record.exact
    assert record.prompt_tokens == 5  # as message_start reported it
    assert record.completion_tokens >= estimate_text(THINKING) + estimate_text(ARGUMENTS)


def test_a_stream_cut_after_its_message_delta_keeps_the_output_count_reported(
        client: openai.OpenAI, scripted: ScriptedAnthropic, usage: RecordingSink) -> None:
    before = len(usage.records)
    scripted.script = [START, *REASONED_CALL, MESSAGE_DELTA]  # and no message_stop
    with pytest.raises(openai.APIError):
        _stream(client)
    record = _record(usage, before)
    assert record.extra == {"outcome": "failed"}
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (5, 42, True)


def test_a_whole_stream_without_an_output_count_is_estimated(
        client: openai.OpenAI, scripted: ScriptedAnthropic, usage: RecordingSink) -> None:
    """message_start's output count (1) is no count of the answer: without message_delta's, it is estimated."""
    before = len(usage.records)
    no_count = ("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {}})
    scripted.script = [START, *REASONED_CALL, no_count, ("message_stop", {})]
    _stream(client)
    record = _record(usage, before)
    assert record.prompt_tokens == 5 and not record.exact
    assert record.completion_tokens >= estimate_text(THINKING) + estimate_text(ARGUMENTS)


@pytest.mark.parametrize("reported", [None, {"input_tokens": 5}], ids=["none", "input-only"])
def test_a_whole_answer_without_usage_is_estimated_not_zero(
        client: openai.OpenAI, scripted: ScriptedAnthropic, usage: RecordingSink, reported: Any) -> None:
    """The record holds the estimate, inexact, and the chat answer shows it."""
    before = len(usage.records)
    content = [{"type": "thinking", "thinking": THINKING, "signature": "s"},
               {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]
    scripted.script = (200, {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                             "content": content, "stop_reason": "tool_use", "stop_sequence": None}
                       | ({"usage": reported} if reported is not None else {}))
    answer = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": PROMPT}])
    record = _record(usage, before)
    assert not record.exact and record.completion_tokens >= estimate_text(THINKING)
    assert record.prompt_tokens == 5 if reported else record.prompt_tokens >= estimate_text(PROMPT)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (record.prompt_tokens,
                                                                            record.completion_tokens)
