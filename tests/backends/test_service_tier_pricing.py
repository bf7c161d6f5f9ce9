"""A request is priced at the rates of the service tier its answer says it was served at
(``prices.<model>.service_tiers``): OpenAI's ``service_tier`` on a chat or text completion (streamed:
on its chunks) and on a Responses answer, Anthropic's ``usage.service_tier``; a tier the prices do
not list, or none said, is priced at the model's own rates. The usage row notes the tier. The
official SDKs against a gateway on loopback and loopback upstreams that answer at the tier asked for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.contracts import UsageRecord
from tests.backends.conftest import admin_gateway, three_providers
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_responses import USAGE, FakeResponsesUpstream
from tests.support.fake_upstream import RICH_USAGE, FakeUpstream, Fault

OWN = {"input_per_million": 2.0, "output_per_million": 8.0, "cached_input_per_million": 0.5}
TIERS = {"priority": {"input_per_million": 3.5, "output_per_million": 14.0},  # cached: the model's own
         "flex": {"input_per_million": 1.0, "output_per_million": 4.0, "cached_input_per_million": 0.25}}
PRICE = OWN | {"service_tiers": TIERS}
RATES = {"priority": (3.5, 14.0, 0.5), "flex": (1.0, 4.0, 0.25), "default": (2.0, 8.0, 0.5)}


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic]]:
    chat, responses, messages = FakeUpstream().start(), FakeResponsesUpstream().start(), FakeAnthropic().start()
    chat.rich = True
    yield chat, responses, messages
    for server in (chat, responses, messages):
        server.stop()


@pytest.fixture(scope="module")
def usage() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(scope="module")
def gateway_url(upstreams: tuple[FakeUpstream, FakeResponsesUpstream, FakeAnthropic],
                usage: RecordingSink) -> Iterator[str]:
    models = three_providers(*(upstream.url for upstream in upstreams))
    prices = {"gpt": PRICE, "native": PRICE, "claude": PRICE, "pair": PRICE}
    with admin_gateway(models, prices, usage) as server:
        yield server.url


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def _cost(tier: str, prompt: int, cached: int, output: int) -> float:
    plain, out, read = RATES[tier]
    return ((prompt - cached) * plain + cached * read + output * out) / 1e6


def _records(usage: RecordingSink, before: int, count: int) -> list[UsageRecord]:
    return usage.wait_for(before + count)[before:]


@pytest.mark.parametrize(("asked", "served"), [("priority", "priority"), ("flex", "flex"), ("auto", "default")])
def test_chat_and_completions_are_priced_at_the_tier_served(client: openai.OpenAI, usage: RecordingSink,
                                                            asked: str, served: str) -> None:
    before = len(usage.records)
    tier: Any = {"service_tier": asked}
    answer = client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}], **tier)
    assert answer.service_tier == served  # relayed as the upstream said it
    chunks = list(client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, **tier))
    assert {c.service_tier for c in chunks} == {served}
    client.completions.create(model="gpt", prompt="hi", extra_body=tier)
    list(client.completions.create(model="gpt", prompt="hi", stream=True, extra_body=tier))
    cached = RICH_USAGE["prompt_tokens_details"]["cached_tokens"]
    expected = _cost(served, RICH_USAGE["prompt_tokens"], cached, RICH_USAGE["completion_tokens"])
    for record in _records(usage, before, 4):
        assert record.cost == pytest.approx(expected)
        assert record.service_tier == served


@pytest.mark.parametrize(("asked", "served"), [("priority", "priority"), ("flex", "flex"), (None, "default")])
def test_a_responses_answer_is_priced_at_the_tier_served(client: openai.OpenAI, usage: RecordingSink,
                                                         asked: str | None, served: str) -> None:
    before = len(usage.records)
    tier: Any = {"service_tier": asked} if asked else {}
    answer = client.responses.create(model="native", input="hi", **tier)
    assert answer.service_tier == served
    events = list(client.responses.create(model="native", input="hi", stream=True, **tier))
    assert events[-1].response.service_tier == served
    expected = _cost(served, USAGE["input_tokens"], 2, USAGE["output_tokens"])
    for record in _records(usage, before, 2):
        assert record.cost == pytest.approx(expected)
        assert record.service_tier == served


@pytest.mark.parametrize(("asked", "served"), [("auto", "priority"), ("standard_only", "standard")])
def test_an_anthropic_answer_is_priced_at_the_tier_its_usage_names(gateway_url: str, usage: RecordingSink,
                                                                   asked: Any, served: str) -> None:
    """``standard`` is not listed in the prices: the model's own rates."""
    ant = anthropic.Anthropic(base_url=gateway_url, api_key=ADMIN_KEY, max_retries=0)
    before = len(usage.records)
    messages: Any = [{"role": "user", "content": "hello there"}]
    answer = ant.messages.create(model="claude", max_tokens=8, messages=messages, service_tier=asked)
    assert answer.usage.service_tier == served
    with ant.messages.stream(model="claude", max_tokens=8, messages=messages, service_tier=asked) as stream:
        streamed = stream.get_final_message()
    rates = "default" if served == "standard" else served
    for record, reported in zip(_records(usage, before, 2), [answer.usage, streamed.usage], strict=True):
        prompt = reported.input_tokens + (reported.cache_read_input_tokens or 0)
        assert record.cost == pytest.approx(_cost(rates, prompt, 2, reported.output_tokens))
        assert record.service_tier == served


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_request_to_an_anthropic_deployment_is_priced_at_the_tier_its_usage_names(
        client: openai.OpenAI, usage: RecordingSink, stream: bool) -> None:
    """/v1/chat/completions translated to Anthropic's Messages API: the tier of its usage, as on /v1/messages."""
    before = len(usage.records)
    tier: Any = {"service_tier": "auto"}  # a value both APIs take: served at the priority tier
    answer = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hello there"}],
                                            max_tokens=8, stream=stream, **tier)
    if stream:
        list(answer)
    record = _records(usage, before, 1)[0]
    assert record.exact and record.service_tier == "priority"
    assert record.cost == pytest.approx(_cost("priority", record.prompt_tokens, record.cached_tokens,
                                              record.completion_tokens))


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_retried_on_another_deployment_is_priced_at_the_tier_of_the_answer(
        client: openai.OpenAI, usage: RecordingSink, upstreams: tuple[FakeUpstream, ...], stream: bool) -> None:
    """The first attempt fails before any byte; the meter is the answering attempt's, tier and all."""
    before = len(usage.records)
    upstream = upstreams[0]
    upstream.fail_next(Fault(status=503))
    sent = len(upstream.received)
    answer = client.chat.completions.create(model="pair", messages=[{"role": "user", "content": "hi"}],
                                            stream=stream, service_tier="flex")
    if stream:
        list(answer)
    assert len(upstream.received) == sent + 2  # the failed attempt, then the one that answered
    record = _records(usage, before, 1)[0]
    assert record.status == 200 and record.service_tier == "flex"
    cached = RICH_USAGE["prompt_tokens_details"]["cached_tokens"]
    assert record.cost == pytest.approx(_cost("flex", RICH_USAGE["prompt_tokens"], cached,
                                              RICH_USAGE["completion_tokens"]))


def test_an_answer_naming_no_tier_is_priced_at_the_models_own_rates(client: openai.OpenAI, usage: RecordingSink,
                                                                    upstreams: tuple[FakeUpstream, ...]) -> None:
    upstreams[0].rich = False  # the plain echo answer: no service_tier field
    try:
        before = len(usage.records)
        answer = client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}],
                                                service_tier="priority")
    finally:
        upstreams[0].rich = True
    assert answer.service_tier is None and answer.usage is not None
    record = _records(usage, before, 1)[0]
    assert record.cost == pytest.approx(_cost("default", answer.usage.prompt_tokens, 0, answer.usage.completion_tokens))
    assert record.service_tier is None


def test_a_stream_cut_short_is_priced_at_the_tier_its_first_chunk_named(client: openai.OpenAI, usage: RecordingSink,
                                                                        upstreams: tuple[FakeUpstream, ...]) -> None:
    """No usage chunk came (the upstream ended the body part-way): the estimate, at the tier's rates."""
    upstream = upstreams[0]
    upstream.rich = False  # the fault's stream: chunks naming the tier asked for, then the body ends
    upstream.fail_next(Fault(end_after_chunks=2))
    before = len(usage.records)
    try:
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "one two three"}],
                                                stream=True, service_tier="priority"))
    finally:
        upstream.rich = True
    record = _records(usage, before, 1)[0]
    assert not record.exact and record.completion_tokens > 0
    assert record.cost == pytest.approx(_cost("priority", record.prompt_tokens, 0, record.completion_tokens))
    assert record.service_tier == "priority"


@pytest.mark.parametrize("finished", [False, True])
def test_a_tier_named_after_the_first_chunk_prices_a_stream_without_usage(
        client: openai.OpenAI, usage: RecordingSink, upstreams: tuple[FakeUpstream, ...], finished: bool) -> None:
    """A stream whose first chunk names no tier (Azure's first, the prompt filter results, names none;
    openai-ruby keeps the latest tier a chunk names for this reason) and that sends no usage chunk:
    the tier the later chunks name, whether it is cut short or ends without usage."""
    upstream = upstreams[0]
    upstream.rich = False
    upstream.fail_next(Fault(end_after_chunks=3, finish_last=finished, tier_from_chunk=1))
    before = len(usage.records)
    try:
        answer = client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "one two three"}],
                                                stream=True, service_tier="priority")
        if finished:
            assert {c.service_tier for c in answer} == {None, "priority"}
        else:
            with pytest.raises(openai.APIError):
                list(answer)
    finally:
        upstream.rich = True
    record = _records(usage, before, 1)[0]
    assert not record.exact and record.completion_tokens > 0
    assert record.service_tier == "priority"
    assert record.cost == pytest.approx(_cost("priority", record.prompt_tokens, 0, record.completion_tokens))
