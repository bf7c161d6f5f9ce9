"""Routing as operators and clients see it, across real loopback upstreams: a provider refusing a
deployment's key, what a fallback's answer is named and priced at, aliases, a half-open circuit's
single trial, least_busy under concurrent streams, a stream's own first-byte timeout, a wait-out that
finds its deployment at its limits."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, client, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "route me"}]
# a 429 for one request alone (some of every limit left), asking for a second's wait: waited out
SHORT_WAIT = Fault(status=429, headers={"retry-after": "1", "x-ratelimit-remaining-requests": "499",
                                        "x-ratelimit-remaining-tokens": "2000"})
WORDS: Any = [{"role": "user", "content": "one two three four five six seven eight"}]  # over 5 tokens
BAD_KEY = Fault(status=401, body={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                            "code": "invalid_api_key"}})


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [
        group("keyed", dep("ky-a", a), dep("ky-b", b)),
        group("keyed-count", dep("kc-a", a), dep("kc-b", b), circuit={"failures": 2, "window": 60, "cooldown": 60}),
        group("keyed-lone", dep("kl-a", a)),
        group("keyed-spill", dep("ks-a", a), fallbacks=["dear"]),
        group("cheap", dep("ch-a", a), max_retries=0, fallbacks=["dear"], aliases=["thrifty", "thrift-*"]),
        group("dear", dep("de-b", b), max_retries=0),
        group("trial", dep("tr-a", a), dep("tr-b", b), max_retries=1,
               circuit={"failures": 1, "window": 60, "cooldown": 0.3}),
        group("busy", dep("bu-a", a), dep("bu-b", b), strategy="least_busy", max_retries=0),
        group("claude", dep("cl-a", a, provider="anthropic", api_key="sk-ant"), dep("cl-b", b)),
        group("tpm-burst", dep("tb-a", a, tokens_per_minute=5), dep("tb-b", b), max_retries=0),
        group("capped-wait", dep("cw-a", a, max_concurrency=1), fallbacks=["spare"]),
        group("tpm-wait", dep("tw-a", a, tokens_per_minute=5), fallbacks=["spare"]),
        group("spare", dep("sp-b", b)),
        group("slow-head", dep("sh-a", a, timeouts={"connect": 1, "first_byte": 0.3, "total": 5}), dep("sh-b", b)),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    prices = {"cheap": {"input_per_million": 1, "output_per_million": 1},
              "dear": {"input_per_million": 1000, "output_per_million": 1000}}
    with routing_gateway(_models, prices=prices) as env:
        yield env

# ---------------------------------------------------------------- a provider refusing the deployment's key


def test_a_bad_provider_key_moves_to_the_next_deployment(env: Env, client: openai.OpenAI) -> None:
    """One deployment's key is wrong (an operator's mistake): the others serve the client."""
    env.a.fail_next(BAD_KEY)
    reply = client.chat.completions.create(model="keyed", messages=MESSAGES)
    assert reply.choices[0].message.content == "route me" and reply.model == "keyed"
    assert env.counts() == (1, 1)
    row = env.only_row()
    assert (row.status, row.error_type, row.deployment) == (200, None, "ky-b")


def test_a_bad_provider_key_counts_against_the_deployments_circuit(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(BAD_KEY, Fault(status=403))
    for _ in range(2):
        assert client.chat.completions.create(model="keyed-count", messages=MESSAGES).choices
    assert env.state("kc-a") == "open" and env.counts() == (2, 2)


def test_a_bad_provider_key_falls_back(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(BAD_KEY)
    assert client.chat.completions.create(model="keyed-spill", messages=MESSAGES).model == "keyed-spill"
    assert env.counts() == (1, 1)  # not retried where the same key is refused


def test_a_bad_provider_key_everywhere_is_a_502_not_the_clients_fault(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(BAD_KEY)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="keyed-lone", messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "upstream_auth"
    assert env.counts() == (1, 0)
    row = env.only_row()
    assert (row.status, row.error_type, row.deployment) == (502, "upstream_auth", "kl-a")


# ---------------------------------------------------------------- fallbacks and aliases


def test_a_fallbacks_answer_names_the_model_asked_for_and_costs_what_it_served(env: Env,
                                                                                client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=503))
    assert client.chat.completions.create(model="cheap", messages=MESSAGES).model == "cheap"
    row = env.only_row()
    assert (row.model, row.deployment) == ("cheap", "de-b")
    tokens = row.prompt_tokens + row.completion_tokens
    assert tokens > 0 and row.cost == pytest.approx(tokens * 1000 / 1e6)  # "dear" served it, at its price


def test_an_alias_routes_to_its_model_and_is_answered_under_its_own_name(env: Env, client: openai.OpenAI) -> None:
    assert client.chat.completions.create(model="thrifty", messages=MESSAGES).model == "thrifty"
    assert client.chat.completions.create(model="thrift-9", messages=MESSAGES).model == "thrift-9"
    assert env.counts() == (2, 0)
    rows = env.usage.wait_for(2)
    assert {r.model for r in rows} == {"cheap"}


def test_models_lists_aliases_but_not_wildcards(env: Env, client: openai.OpenAI) -> None:
    cards = {m.id: m for m in client.models.list()}
    assert "thrifty" in cards and not any("*" in name for name in cards)
    assert (cards["thrifty"].model_extra or {})["metadata"]["alias_of"] == "cheap"
    assert client.models.retrieve("thrift-9").id == "thrift-9"


# ---------------------------------------------------------------- the circuit's half-open trial


def test_a_half_open_circuit_sends_one_trial_not_a_burst(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=500))
    assert client.chat.completions.create(model="trial", messages=MESSAGES).model == "trial"  # tr-b answers
    assert env.state("tr-a") == "open"
    time.sleep(0.35)
    env.a.fail_next(Fault(status=500, delay=0.5))  # the trial is slow, and fails

    def ask(_: int) -> str:
        try:
            return client.chat.completions.create(model="trial", messages=MESSAGES).model
        except openai.APIStatusError as exc:
            return str(exc.status_code)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert len(env.a.received) == 2  # the failure that opened the circuit, then one trial
    assert answers.count("trial") >= 7 and env.state("tr-a") == "open"
    time.sleep(0.35)
    assert client.chat.completions.create(model="trial", messages=MESSAGES).choices  # the trial succeeds
    assert env.state("tr-a") == "healthy"


def test_a_request_sent_before_the_circuit_opened_does_not_free_the_trial_slot(env: Env,
                                                                              client: openai.OpenAI) -> None:
    """A slow request on tr-a ends with its own 400 while the half-open trial is still in flight:
    the next request goes to tr-b, not to tr-a as a second trial."""
    env.a.fail_next(Fault(status=400, delay=1.0), Fault(status=500), Fault(status=500, delay=1.5))

    def ask(_: int) -> str:
        try:
            return client.chat.completions.create(model="trial", messages=MESSAGES).model
        except openai.APIStatusError as exc:
            return str(exc.status_code)

    with ThreadPoolExecutor(2) as pool:
        straggler = pool.submit(ask, 0)  # sent while the circuit is closed
        time.sleep(0.1)
        assert ask(1) == "trial"  # tr-a's 500 opens its circuit; tr-b answers
        time.sleep(0.4)
        trial = pool.submit(ask, 2)  # the half-open trial, slow
        assert straggler.result() == "400"
        assert ask(3) == "trial"
        assert trial.result() == "trial"  # it failed on tr-a, tr-b answered it
    assert len(env.a.received) == 3 and len(env.b.received) == 3


def test_concurrent_requests_count_against_tokens_per_minute_before_they_are_metered(
        env: Env, client: openai.OpenAI) -> None:
    """tb-a may take 5 tokens a minute; two requests sent together (each prompt over 5 tokens): the
    one in flight there counts, so the other goes to tb-b, not both to tb-a."""
    env.a.options.latency = 0.5
    words: Any = [{"role": "user", "content": "one two three four five six seven eight"}]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.chat.completions.create, model="tpm-burst", messages=words)
        time.sleep(0.2)
        assert client.chat.completions.create(model="tpm-burst", messages=words).choices
        assert first.result().choices
    assert env.counts() == (1, 1)


# ---------------------------------------------------------------- a wait-out finding its deployment at its limits


@pytest.mark.parametrize("model", ["capped-wait", "tpm-wait"])
def test_a_request_waiting_out_a_429_respects_its_deployments_limits(env: Env, client: openai.OpenAI,
                                                                     model: str) -> None:
    """A waits out its deployment's short Retry-After; meanwhile B takes the deployment's one slot
    (``max_concurrency`` 1) or its tokens per minute (5) with a slow answer: A, after its wait, is
    not sent there next to B but to the fallback, as a new request would be."""
    env.a.fail_next(SHORT_WAIT, Fault(delay=1.5))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.chat.completions.create, model=model, messages=WORDS)
        while not env.a.received:
            time.sleep(0.01)
        time.sleep(0.1)  # the 429 is back at the gateway: A waits
        assert client.chat.completions.create(model=model, messages=WORDS).choices  # B, slow
        assert first.result(timeout=10).choices
    assert env.a.peak_in_flight == 1
    assert env.counts() == (2, 1)  # A's 429, B; then A on the fallback
    assert [r.status for r in env.usage.wait_for(2)] == [200, 200]


# ---------------------------------------------------------------- streams


def test_least_busy_spreads_concurrent_streams(env: Env, client: openai.OpenAI) -> None:
    for upstream in (env.a, env.b):
        upstream.fail_next(*[Fault(hang_after_chunks=1)] * 4)
    streams = []
    for _ in range(4):
        stream = client.chat.completions.create(model="busy", messages=MESSAGES, stream=True)
        next(iter(stream))
        streams.append(stream)
    assert env.counts() == (2, 2)
    for stream in streams:
        stream.close()
    env.usage.wait_for(4)  # settled before the next test


def test_a_streams_first_byte_timeout_moves_to_the_next_deployment(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(delay=1.0))
    started = time.monotonic()
    chunks = list(client.chat.completions.create(model="slow-head", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "route me"
    assert time.monotonic() - started < 0.9 and env.counts() == (1, 1)
    row = env.only_row()
    assert (row.status, row.deployment) == (200, "sh-b")


@pytest.mark.parametrize("fault", [Fault(hang_after_chunks=0), Fault(end_after_chunks=0)], ids=["silent", "empty"])
def test_a_stream_that_sends_no_event_is_retried(env: Env, client: openai.OpenAI, fault: Fault) -> None:
    """Headers, then nothing (or the end): nothing reached the client yet, so the next deployment answers."""
    env.a.fail_next(fault)
    chunks = list(client.chat.completions.create(model="slow-head", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "route me"
    assert env.counts() == (1, 1)
    row = env.only_row()
    assert (row.status, row.deployment) == (200, "sh-b")


@pytest.mark.parametrize("kind", ["api_error", "overloaded_error"])
def test_an_anthropic_streams_first_event_naming_a_server_error_is_retried(env: Env, client: openai.OpenAI,
                                                                           kind: str) -> None:
    """As an OpenAI-compatible stream's is: by the status its error type names (api_error: a 500)."""
    event = {"type": "error", "error": {"type": kind, "message": "boom"}}
    env.a.fail_next(Fault(status=200, headers={"content-type": "text/event-stream"},
                          body=b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"))
    chunks = list(client.chat.completions.create(model="claude", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "route me"
    assert env.counts() == (1, 1)
    assert env.only_row().deployment == "cl-b"
