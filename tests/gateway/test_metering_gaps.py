"""Usage metering where the provider reports only part of it, or nothing because the client left:
exact where the provider reported a count, an estimate (marked inexact) where it did not, never a
0 for tokens an upstream spent; and the quota settlement is what the record holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from backends.estimate import estimate_text
from gateway.contracts import Principal, UsageRecord
from tests.conftest import gateway_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

KEY = "sk-sy-metering"
PROMPT = "count every word of this prompt"
ANSWER = "one two three four five six"
SSE = {"content-type": "text/event-stream"}


class Env:
    def __init__(self, server: ServerThread, usage: RecordingSink, admission: ScriptedAdmission) -> None:
        self.server, self.usage, self.admission = server, usage, admission

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.url + "/v1", api_key=KEY, max_retries=0, **kw)

    def record(self) -> UsageRecord:
        [record] = self.usage.wait_for(1)
        [settled] = self.admission.settled
        assert settled.actual_tokens == record.prompt_tokens + record.completion_tokens  # quotas as recorded
        assert settled.cost == pytest.approx(record.cost or 0.0)  # None: no price (the writer prices it)
        return record


@pytest.fixture(scope="module")
def gateway(fake_upstream_server: FakeUpstream) -> Iterator[Env]:
    url = fake_upstream_server.url
    deployment = {"provider": "openai", "model": "m", "api_base": url,
                  "timeouts": {"connect": 2, "first_byte": 5, "total": 10}}
    settings = gateway_settings(url, models=[
        {"name": "echo", "deployments": [deployment], "max_retries": 0, "circuit": {"failures": 1_000_000}},
        {"name": "held", "deployments": [deployment | {"name": "held-dep"}], "max_retries": 1,
         "retry_backoff": 0.01, "circuit": {"failures": 1_000_000}},
        {"name": "passed", "deployments": [deployment | {"name": "passed-dep", "responses_api": True}],
         "max_retries": 0, "circuit": {"failures": 1_000_000}},
    ], prices={"echo": {"input_per_million": 1_000_000, "output_per_million": 2_000_000}})
    usage, admission = RecordingSink(), ScriptedAdmission()
    keys = {KEY: Principal(key_id="k", tenant_id="t")}
    with scripted_gateway(settings, keys, admission=admission, usage=usage) as server:
        yield Env(server, usage, admission)


@pytest.fixture
def env(gateway: Env, upstream: FakeUpstream) -> Env:
    gateway.usage.records.clear()
    gateway.admission.settled.clear()
    return gateway


def _answer(chat: bool, usage: dict[str, Any]) -> dict[str, Any]:
    choice = ({"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"} if chat
              else {"index": 0, "text": ANSWER, "finish_reason": "stop"})
    return {"id": "x", "object": "chat.completion" if chat else "text_completion", "created": 0, "model": "m",
            "choices": [choice], "usage": usage}


def _events(chat: bool, usage: dict[str, Any]) -> bytes:
    def chunk(piece: str | None, finish: str | None) -> dict[str, Any]:
        choice = ({"index": 0, "delta": {} if piece is None else {"content": piece}, "finish_reason": finish}
                  if chat else {"index": 0, "text": piece or "", "finish_reason": finish})
        return {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                "model": "m", "choices": [choice]}

    events = [chunk(word + " ", None) for word in ANSWER.split()] + [chunk(None, "stop")]
    events.append(chunk(None, None) | {"choices": [], "usage": usage})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _create(client: openai.OpenAI, chat: bool, stream: bool) -> str:
    """The answer's text."""
    if chat:
        if not stream:
            return client.chat.completions.create(model="echo", messages=[{"role": "user", "content": PROMPT}]
                                                  ).choices[0].message.content or ""
        parts = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": PROMPT}],
                                               stream=True)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    if not stream:
        return client.completions.create(model="echo", prompt=PROMPT).choices[0].text
    return "".join(c.choices[0].text for c in client.completions.create(model="echo", prompt=PROMPT, stream=True)
                   if c.choices)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("missing", ["completion_tokens", "prompt_tokens"])
@pytest.mark.parametrize("null", [False, True], ids=["absent", "null"])
def test_a_count_the_upstream_left_out_of_its_usage_is_estimated_not_zero(
        env: Env, upstream: FakeUpstream, chat: bool, stream: bool, missing: str, null: bool) -> None:
    """Left out, or sent as null (the answer is relayed, not a 502)."""
    reported: dict[str, int | None] = {"prompt_tokens": 3, "completion_tokens": 6}
    if null:
        reported[missing] = reported["total_tokens"] = None
    else:
        del reported[missing]
    body = _events(chat, reported) if stream else _answer(chat, reported)
    upstream.fail_next(Fault(status=200, body=body, headers=SSE if stream else {}))
    assert _create(env.client(), chat, stream).split() == ANSWER.split()
    record = env.record()
    assert record.status == 200 and not record.exact
    if missing == "completion_tokens":
        assert record.prompt_tokens == 3  # as reported
        assert record.completion_tokens >= estimate_text(ANSWER)  # from the answer's text
    else:
        assert record.completion_tokens == 6
        assert record.prompt_tokens >= estimate_text(PROMPT)  # from the prompt


def test_a_null_count_in_a_whole_answer_reaches_the_client_as_sent(env: Env, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=200, body=_answer(True, {"prompt_tokens": 3, "completion_tokens": None})))
    raw = env.client().chat.completions.with_raw_response.create(
        model="echo", messages=[{"role": "user", "content": PROMPT}])
    assert json.loads(raw.text)["usage"] == {"prompt_tokens": 3, "completion_tokens": None}
    record = env.record()
    assert record.prompt_tokens == 3 and record.completion_tokens >= estimate_text(ANSWER) and not record.exact


def test_an_embeddings_usage_with_a_null_count_is_estimated(env: Env, upstream: FakeUpstream) -> None:
    body = {"object": "list", "model": "m", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
            "usage": {"prompt_tokens": None, "total_tokens": None}}
    upstream.fail_next(Fault(status=200, body=body))
    assert env.client().embeddings.create(model="echo", input=PROMPT).data[0].embedding == [0.5]
    record = env.record()
    assert record.status == 200 and not record.exact and record.prompt_tokens >= estimate_text(PROMPT)


def test_an_embeddings_usage_with_a_negative_count_is_estimated(env: Env, upstream: FakeUpstream) -> None:
    body = {"object": "list", "model": "m", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
            "usage": {"prompt_tokens": -1_000_000, "total_tokens": -1_000_000}}
    upstream.fail_next(Fault(status=200, body=body))
    assert env.client().embeddings.create(model="echo", input=PROMPT).data[0].embedding == [0.5]
    record = env.record()
    assert record.status == 200 and not record.exact and record.prompt_tokens >= estimate_text(PROMPT)


def test_a_usage_holding_both_counts_stays_exact_with_a_zero_completion(env: Env, upstream: FakeUpstream) -> None:
    upstream.fail_next(Fault(status=200, body=_answer(True, {"prompt_tokens": 3, "completion_tokens": 0})))
    _create(env.client(), True, False)
    record = env.record()
    assert (record.prompt_tokens, record.completion_tokens, record.exact) == (3, 0, True)


@pytest.mark.parametrize(("endpoint", "stream"), [
    ("chat", False), ("chat", True), ("completions", False), ("completions", True), ("embeddings", False)])
def test_a_client_gone_before_the_first_byte_is_charged_the_prompt_the_upstream_has(
        env: Env, upstream: FakeUpstream, endpoint: str, stream: bool) -> None:
    """The upstream has the request (and most likely bills its prompt) when the client gives up:
    the record holds the prompt's estimate, inexact, and the quotas are settled with it (embeddings
    are never streamed)."""
    upstream.fail_next(Fault(delay=3))
    client = env.client(timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        if endpoint == "embeddings":
            client.embeddings.create(model="echo", input=PROMPT)
        else:
            _create(client, endpoint == "chat", stream)
    record = env.record()
    assert (record.status, record.error_type, record.extra) == (499, "client_disconnected",
                                                              {"outcome": "client_disconnected"})
    assert record.prompt_tokens >= estimate_text(PROMPT) and record.completion_tokens == 0 and not record.exact
    assert record.cost is not None and record.cost > 0


def test_a_client_gone_while_its_request_waits_out_a_hold_off_is_charged_nothing(
        env: Env, upstream: FakeUpstream) -> None:
    """The first attempt was refused (429, wait 3 s): the upstream spent nothing on it, and the
    client left before the second was sent."""
    upstream.fail_next(Fault(status=429, headers={"retry-after": "3"}))
    with pytest.raises(openai.APITimeoutError):
        env.client(timeout=1).chat.completions.create(model="held", messages=[{"role": "user", "content": PROMPT}])
    record = env.record()
    assert (record.status, record.error_type) == (499, "client_disconnected")
    assert (record.prompt_tokens, record.completion_tokens) == (0, 0)
    assert len(upstream.received) == 1  # the second attempt was never sent


ARGUMENTS = '{"city": "Paris"}'
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_tool_calls_and_reasoning_an_upstream_reports_no_usage_for_are_estimated(
        env: Env, upstream: FakeUpstream, stream: bool) -> None:
    """Without usage, the completion's estimate counts every generated field, not the content alone."""
    if stream:
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}, {"reasoning_content": "think it over"},
                  {"tool_calls": [{"index": 0} | TOOL_CALL]}]
        events = [{"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                   "choices": [{"index": 0, "delta": d, "finish_reason": "tool_calls" if "tool_calls" in d else None}]}
                  for d in deltas]
        body: Any = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    else:
        message = {"role": "assistant", "content": None, "reasoning_content": "think it over",
                   "tool_calls": [TOOL_CALL]}
        body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    upstream.fail_next(Fault(status=200, body=body, headers=SSE if stream else {}))
    client = env.client()
    messages: Any = [{"role": "user", "content": PROMPT}]
    if stream:
        list(client.chat.completions.create(model="echo", messages=messages, stream=True))
    else:
        client.chat.completions.create(model="echo", messages=messages)
    record = env.record()
    assert not record.exact and record.prompt_tokens >= estimate_text(PROMPT)
    assert record.completion_tokens >= estimate_text("think it over") + estimate_text(ARGUMENTS)


def test_a_chunk_opening_several_choices_with_no_text_generated_nothing(env: Env, upstream: FakeUpstream) -> None:
    """n=2: a first chunk naming both choices' role, their content empty, is no token (it was estimated
    as one, the two empty texts joined by a space, and taken as the first token for the TTFT)."""
    def chunk(*deltas: dict[str, Any], finish: str | None = None) -> bytes:
        choices = [{"index": i, "delta": d, "finish_reason": finish} for i, d in enumerate(deltas)]
        event = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices}
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    opening = {"role": "assistant", "content": ""}
    answer = {"content": ANSWER}
    body = chunk(opening, opening) + chunk(answer, answer, finish="stop") + b"data: [DONE]\n\n"
    upstream.fail_next(Fault(status=200, body=body, headers=SSE))
    list(env.client().chat.completions.create(model="echo", messages=[{"role": "user", "content": PROMPT}], n=2,
                                              stream=True))
    record = env.record()
    assert not record.exact and record.completion_tokens == estimate_text(f"{ANSWER} {ANSWER}")


@pytest.mark.parametrize("fault", [Fault(error_after_chunks=3), Fault(end_after_chunks=3)], ids=["error", "cut"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_stream_that_fails_mid_way_counts_the_chunks_it_relayed(
        env: Env, upstream: FakeUpstream, chat: bool, fault: Fault) -> None:
    upstream.fail_next(fault)
    with pytest.raises(openai.APIError):
        _create(env.client(), chat, True)
    record = env.record()
    assert record.extra == {"outcome": "failed"} and not record.exact
    assert record.prompt_tokens >= estimate_text(PROMPT) and record.completion_tokens >= 3


@pytest.mark.parametrize("negative", [False, True], ids=["absent", "negative"])
@pytest.mark.parametrize("missing", ["output_tokens", "input_tokens"])
def test_a_count_a_responses_upstream_left_out_is_estimated(env: Env, upstream: FakeUpstream, missing: str,
                                                            negative: bool) -> None:
    """A Responses API upstream (passed through): the same rule for its input and output counts."""
    usage = {"input_tokens": 3, "output_tokens": 6}
    if negative:
        usage[missing] = -1_000_000
    else:
        del usage[missing]
    output = [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]},
              {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": ARGUMENTS,
               "status": "completed"}]
    upstream.fail_next(Fault(status=200, body={"id": "resp_1", "object": "response", "created_at": 0,
                                               "status": "completed", "model": "m", "output": output,
                                               "usage": usage}))
    env.client().responses.create(model="passed", input=PROMPT, store=False)
    record = env.record()
    assert not record.exact
    if missing == "output_tokens":
        assert record.prompt_tokens == 3
        assert record.completion_tokens >= estimate_text(ANSWER) + estimate_text(ARGUMENTS)
    else:
        assert record.completion_tokens == 6 and record.prompt_tokens >= estimate_text(PROMPT)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_a_translated_answer_shows_the_counts_metered_where_the_upstream_left_one_out(
        env: Env, upstream: FakeUpstream, dialect: str, stream: bool) -> None:
    """A /v1/messages or /v1/responses answer from a chat upstream whose usage lacks the completion
    count: the client is shown the estimate the usage record holds, not 0."""
    reported = {"prompt_tokens": 3}
    upstream.fail_next(Fault(status=200, body=_events(True, reported) if stream else _answer(True, reported),
                             headers=SSE if stream else {}))
    messages: Any = [{"role": "user", "content": PROMPT}]
    if dialect == "messages":
        client = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)
        if stream:
            with client.messages.stream(model="echo", max_tokens=64, messages=messages) as events:
                usage: Any = events.get_final_message().usage
        else:
            usage = client.messages.create(model="echo", max_tokens=64, messages=messages).usage
        shown = (usage.input_tokens, usage.output_tokens)
    else:
        if stream:
            [done] = [e for e in env.client().responses.create(model="echo", input=PROMPT, store=False, stream=True)
                      if e.type == "response.completed"]
            usage = done.response.usage
        else:
            usage = env.client().responses.create(model="echo", input=PROMPT, store=False).usage
        shown = (usage.input_tokens, usage.output_tokens)
    record = env.record()
    assert record.completion_tokens >= estimate_text(ANSWER) and not record.exact
    assert shown == (record.prompt_tokens, record.completion_tokens) and record.prompt_tokens == 3


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("negative", ["prompt_tokens", "completion_tokens", "cached_tokens"])
def test_a_negative_count_is_metered_as_not_reported_and_relayed_as_sent(
        env: Env, upstream: FakeUpstream, chat: bool, stream: bool, negative: str) -> None:
    """A negative count would be a negative cost, a credit to the budget: the meter keeps its
    estimate (inexact) and no cached tokens; the client still gets the usage as the upstream sent it."""
    reported: dict[str, Any] = {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9,
                                "prompt_tokens_details": {"cached_tokens": 2}}
    if negative == "cached_tokens":
        reported["prompt_tokens_details"] = {"cached_tokens": -1_000_000}
    else:
        reported[negative] = -1_000_000
    upstream.fail_next(Fault(status=200, body=_events(chat, reported) if stream else _answer(chat, reported),
                             headers=SSE if stream else {}))
    client, kw = env.client(), {"stream_options": {"include_usage": True}} if stream else {}
    make = client.chat.completions if chat else client.completions
    prompt: Any = {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    raw = make.with_raw_response.create(model="echo", stream=stream, **prompt, **kw)  # type: ignore[call-overload]
    body = raw.http_response.read().decode()
    if stream:
        [shown] = [json.loads(line[6:])["usage"] for line in body.splitlines()
                   if line.startswith("data: {") and json.loads(line[6:]).get("usage")]
    else:
        shown = json.loads(body)["usage"]
    assert shown == reported  # the gateway is transparent: only its metering ignores the count
    record = env.record()
    assert record.status == 200 and not record.exact
    assert record.cost is not None and record.cost >= 0
    assert record.cached_tokens == (0 if negative == "cached_tokens" else 2)
    if negative == "prompt_tokens":
        assert record.prompt_tokens >= estimate_text(PROMPT) and record.completion_tokens == 6
    elif negative == "completion_tokens":
        assert record.prompt_tokens == 3 and record.completion_tokens >= estimate_text(ANSWER)
    else:
        assert (record.prompt_tokens, record.completion_tokens) == (3, 6)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_an_estimate_of_several_choices_counts_each_choice_s_words(env: Env, upstream: FakeUpstream,
                                                                   stream: bool) -> None:
    """An upstream reporting no usage for ``n: 2``: each choice echoes the prompt's 6 words, so the
    estimate is 12 completion tokens (the choices' texts are not run together, "f" and "a" one word)."""
    upstream.options.report_usage = False
    prompt = "a b c d e f"
    client = env.client()
    if stream:
        texts: dict[int, str] = {}
        for chunk in client.completions.create(model="echo", prompt=prompt, n=2, stream=True):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
    else:
        texts = {c.index: c.text for c in client.completions.create(model="echo", prompt=prompt, n=2).choices}
    assert texts == {0: prompt, 1: prompt}
    record = env.record()
    assert (record.completion_tokens, record.exact) == (2 * estimate_text(prompt), False)


def test_an_estimate_of_a_streamed_chat_with_several_choices_counts_no_empty_delta(
        env: Env, upstream: FakeUpstream) -> None:
    """The role chunk and the finish chunk of ``n: 2`` hold two empty deltas each: they add no token."""
    upstream.options.report_usage = False
    prompt = "a b c d e f"
    chunks = env.client().chat.completions.create(model="echo", messages=[{"role": "user", "content": prompt}],
                                                  n=2, stream=True)
    assert {c.index for chunk in chunks for c in chunk.choices} == {0, 1}
    record = env.record()
    assert (record.completion_tokens, record.exact) == (2 * estimate_text(prompt), False)
