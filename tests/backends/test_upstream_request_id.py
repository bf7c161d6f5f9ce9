"""The provider's own id of its answer (OpenAI's and vLLM's ``x-request-id``, Azure's
``apim-request-id``, Anthropic's ``request-id``), what its support asks for, is kept on the usage
record for the operator, for whole answers and streams, and for the error answer of the attempt that
failed last; the client is never shown it. The official SDKs against a gateway on loopback and
loopback upstreams that put the id in the head of every answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from backends.http_upstream import MAX_REQUEST_ID
from gateway.contracts import UsageRecord
from tests.backends.conftest import admin_gateway, three_providers
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_responses import FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream, Fault

MESSAGES: Any = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic]]:
    chat, responses, messages = FakeUpstream().start(), FakeResponsesUpstream().start(), FakeAnthropic().start()
    yield chat, responses, messages
    for server in (chat, responses, messages):
        server.stop()


@pytest.fixture
def chat(upstreams: tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic]) -> FakeUpstream:
    upstreams[0].reset()
    return upstreams[0]


@pytest.fixture
def responses(upstreams: tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic]) -> FakeResponsesUpstream:
    upstreams[1].answer_headers = {}
    return upstreams[1]


@pytest.fixture
def messages(upstreams: tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic]) -> FakeAnthropic:
    upstreams[2].answer_headers = {}
    upstreams[2].faults.clear()
    return upstreams[2]


@pytest.fixture(scope="module")
def usage() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def gateway_url(upstreams: tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic],
                usage: RecordingSink) -> Iterator[str]:
    models = three_providers(*(upstream.url for upstream in upstreams), max_retries=1, circuit={"failures": 1000})
    with admin_gateway(models, None, usage) as server:
        yield server.url


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def _record(usage: RecordingSink, before: int) -> UsageRecord:
    (record,) = usage.wait_for(before + 1)[before:]
    return record


def _unseen(upstream_id: str, headers: Any, body: str) -> bool:
    """Neither the client's response head nor its body shows the provider's id."""
    return all(upstream_id not in f"{k}: {v}" for k, v in headers.items()) and upstream_id not in body


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_an_openai_compatible_answers_id_is_recorded_and_not_relayed(client: openai.OpenAI, chat: FakeUpstream,
                                                                     usage: RecordingSink, endpoint: str,
                                                                     stream: bool) -> None:
    chat.answer_headers = {"x-request-id": f"req_up_{endpoint}_{stream}"}
    before = len(usage.records)
    if endpoint == "chat":
        raw: Any = client.chat.completions.with_raw_response.create(model="gpt", messages=MESSAGES, stream=stream)
    else:
        raw = client.completions.with_raw_response.create(model="gpt", prompt="hello there", stream=stream)
    body = json.dumps([c.model_dump() for c in raw.parse()]) if stream else raw.http_response.text
    record = _record(usage, before)
    assert record.status == 200 and record.upstream_request_id == f"req_up_{endpoint}_{stream}"
    assert raw.headers["x-request-id"] == record.request_id  # the gateway's own id, not the provider's
    assert _unseen(f"req_up_{endpoint}_{stream}", raw.headers, body)


@pytest.mark.parametrize(("head", "kept"), [
    ({"apim-request-id": "apim-1", "x-request-id": "x-1"}, "x-1"),  # Azure: both
    ({"apim-request-id": "apim-2"}, "apim-2"),
    ({"request-id": "req_011ant"}, "req_011ant"),
    ({"x-request-id": "r" * 300}, "r" * MAX_REQUEST_ID),  # no longer than the column
    ({"x-request-id": ""}, None),
    ({}, None),
])
def test_the_first_request_id_header_an_answer_holds_is_kept(client: openai.OpenAI, chat: FakeUpstream,
                                                             usage: RecordingSink, head: dict[str, str],
                                                             kept: str | None) -> None:
    chat.answer_headers = head
    before = len(usage.records)
    client.chat.completions.create(model="gpt", messages=MESSAGES)
    assert _record(usage, before).upstream_request_id == kept


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_answers_id_is_recorded_and_not_relayed(client: openai.OpenAI, responses: FakeResponsesUpstream,
                                                            usage: RecordingSink, stream: bool) -> None:
    responses.answer_headers = {"x-request-id": f"req_resp_{stream}"}
    before = len(usage.records)
    raw: Any = client.responses.with_raw_response.create(model="native", input="hello there", stream=stream)
    body = json.dumps([e.model_dump() for e in raw.parse()]) if stream else raw.http_response.text
    assert _record(usage, before).upstream_request_id == f"req_resp_{stream}"
    assert _unseen(f"req_resp_{stream}", raw.headers, body)


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_answers_id_is_recorded_and_not_relayed(gateway_url: str, messages: FakeAnthropic,
                                                             usage: RecordingSink, stream: bool) -> None:
    messages.answer_headers = {"request-id": f"req_011_native_{stream}"}
    ant = anthropic.Anthropic(base_url=gateway_url, api_key=ADMIN_KEY, max_retries=0)
    before = len(usage.records)
    raw: Any = ant.messages.with_raw_response.create(model="claude", max_tokens=8, messages=MESSAGES, stream=stream)
    body = json.dumps([e.model_dump() for e in raw.parse()]) if stream else raw.http_response.text
    assert _record(usage, before).upstream_request_id == f"req_011_native_{stream}"
    assert _unseen(f"req_011_native_{stream}", raw.headers, body)


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_request_to_an_anthropic_deployment_records_its_answers_id(client: openai.OpenAI,
                                                                          messages: FakeAnthropic,
                                                                          usage: RecordingSink, stream: bool) -> None:
    messages.answer_headers = {"request-id": f"req_011_chat_{stream}"}
    before = len(usage.records)
    raw: Any = client.chat.completions.with_raw_response.create(model="claude", messages=MESSAGES, stream=stream)
    body = json.dumps([c.model_dump() for c in raw.parse()]) if stream else raw.http_response.text
    assert _record(usage, before).upstream_request_id == f"req_011_chat_{stream}"
    assert _unseen(f"req_011_chat_{stream}", raw.headers, body)


@pytest.mark.parametrize("stream", [False, True])
def test_the_error_answer_of_the_attempt_that_failed_last_is_recorded_by_its_id(
        client: openai.OpenAI, chat: FakeUpstream, usage: RecordingSink, stream: bool) -> None:
    chat.fail_next(Fault(status=503, headers={"x-request-id": "req_first"}),
                   Fault(status=503, headers={"x-request-id": "req_last"}))
    before = len(usage.records)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="pair", messages=MESSAGES, stream=stream)
    record = _record(usage, before)
    assert record.status == failed.value.status_code and record.upstream_request_id == "req_last"
    assert _unseen("req_", failed.value.response.headers, failed.value.response.text)


def test_a_failed_attempts_id_is_not_the_answers(client: openai.OpenAI, chat: FakeUpstream,
                                                 usage: RecordingSink) -> None:
    """The attempt that answered named no id: none is recorded, not the failed attempt's."""
    chat.fail_next(Fault(status=503, headers={"x-request-id": "req_failed"}))
    before = len(usage.records)
    client.chat.completions.create(model="pair", messages=MESSAGES)
    record = _record(usage, before)
    assert record.status == 200 and record.upstream_request_id is None


def test_an_anthropic_error_answers_id_is_recorded(client: openai.OpenAI, messages: FakeAnthropic,
                                                   usage: RecordingSink) -> None:
    messages.answer_headers = {"request-id": "req_011_refused"}
    messages.fail_next(400, "invalid_request_error")
    before = len(usage.records)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="claude", messages=MESSAGES)
    assert _record(usage, before).upstream_request_id == "req_011_refused"
