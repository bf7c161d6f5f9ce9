"""A model's ``timeout`` bounds a request's whole way to its answer, retries, backoffs and fallbacks
included, across real loopback upstreams: when it runs out the attempt in flight is abandoned (its
upstream sees the gateway hang up), nothing further is tried, and the client gets the 504
``upstream_timeout`` an upstream timeout gets, settled as any failed request is. A stream that has
begun is not cut by it; a wait for a retry that would end after it is not started. An attempt cut
having had the request's whole time counts as a timeout of its deployment; one left only the end of
it does not.

Each chain would take several times the limit without it; the client's elapsed time is compared
with that, with a wide margin either way."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.settings import ConfigError, parse_settings
from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, client, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "one two three four five six seven eight nine ten eleven twelve"}]
SLOW_503 = Fault(status=503, delay=0.8)  # the chain below: 4 + 4 attempts of 0.8 s, over 6 s without a limit
LIMIT = 1.0
PATIENT = {"connect": 1, "first_byte": 30, "total": 60}  # the deployment's own limits: far past the group's
BREAKER = {"failures": 2, "window": 60, "cooldown": 60}


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [
        group("slow", dep("slow-a", a), dep("slow-b", b), max_retries=3, fallbacks=["spare"], timeout=LIMIT),
        group("spare", dep("spare-a", a), dep("spare-b", b), max_retries=3),
        group("hang", dep("hang-a", a, timeouts=PATIENT), fallbacks=["spare"], timeout=LIMIT),
        group("steady", dep("steady-a", a), timeout=LIMIT),
        # every retry's backoff is MAX_BACKOFF (5 s): past the 3 s limit
        group("backoff", dep("backoff-a", a), max_retries=2, retry_backoff=30, timeout=3.0),
        group("held", dep("held-a", a), fallbacks=["spare"], timeout=LIMIT),
        group("held-lone", dep("held-lone-a", a), timeout=LIMIT),
        group("stuck", dep("stuck-a", a, timeouts=PATIENT), dep("stuck-b", b), timeout=LIMIT, circuit=BREAKER),
        group("late", dep("late-a", a), dep("late-b", b, timeouts=PATIENT), timeout=LIMIT,
              circuit=BREAKER | {"failures": 1}),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    with routing_gateway(_models) as env:
        yield env


def _timed_out(client: openai.OpenAI, **request: Any) -> float:
    """The seconds until the request failed with the gateway's 504 ``upstream_timeout``."""
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        reply = client.chat.completions.create(messages=MESSAGES, **request)
        if request.get("stream"):
            list(reply)
    elapsed = time.monotonic() - t0
    assert err.value.status_code == 504, err.value
    assert isinstance(err.value.body, dict) and err.value.body.get("code") == "upstream_timeout"
    # the request's time is spent: an SDK retrying it would multiply the limit
    assert err.value.response.headers.get("x-should-retry") == "false"
    return elapsed


def test_a_chain_of_slow_failures_ends_at_the_limit(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(*[SLOW_503] * 8)
    env.b.fail_next(*[SLOW_503] * 8)
    elapsed = _timed_out(client, model="slow")
    assert elapsed < 3.0  # the chain would take over 6 s
    time.sleep(LIMIT)  # no retry or fallback was started after the answer
    assert sum(env.counts()) <= 2
    row = env.only_row()  # settled as a failed request: its status and kind, nothing charged
    assert (row.status, row.error_type, row.model) == (504, "timeout", "slow")
    assert (row.prompt_tokens, row.completion_tokens, row.cost) == (0, 0, 0)


def test_the_attempt_in_flight_is_abandoned_and_no_fallback_follows(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(hang_after_chunks=0))  # headers, then silence: the deployment's own limit is 30 s
    elapsed = _timed_out(client, model="hang", stream=True)
    assert elapsed < 3.0
    assert env.a.streams[-1].wait(5) and env.a.streams[-1].completed is False  # the gateway hung up
    time.sleep(LIMIT)
    assert env.counts() == (1, 0)  # the fallback was not tried
    row = env.only_row()
    assert (row.status, row.error_type, row.deployment, row.stream) == (504, "timeout", "hang-a", True)
    assert (row.prompt_tokens, row.completion_tokens, row.cost) == (0, 0, 0)


def test_a_stream_that_has_begun_is_not_cut(env: Env, client: openai.OpenAI) -> None:
    env.a.options.chunk_delay = 0.2  # 12 words: 2.4 s, past the 1 s limit
    words = []
    for chunk in client.chat.completions.create(model="steady", messages=MESSAGES, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            words.append(chunk.choices[0].delta.content)
    assert len(words) == 12
    row = env.only_row()
    assert (row.status, row.error_type) == (200, None)


def test_a_backoff_that_would_end_past_the_limit_is_not_waited(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(*[Fault(status=503)] * 3)
    elapsed = _timed_out(client, model="backoff")
    assert elapsed < 2.0  # not the 3 s limit: the 5 s wait was not started
    assert env.counts() == (1, 0)
    assert env.only_row().status == 504


def test_a_hold_off_that_would_end_past_the_limit_goes_to_the_fallbacks(env: Env, client: openai.OpenAI) -> None:
    """Its upstream asks for 3 s without requests (a wait the gateway would take for a second try):
    with 1 s to go, the fallback is tried at once instead, and without one the request ends at once;
    a request that finds the hold already on is answered with the 429 saying how long it has left."""
    hold = Fault(status=429, headers={"retry-after": "3", "x-ratelimit-remaining-requests": "0"})
    env.a.fail_next(hold)
    t0 = time.monotonic()
    assert client.chat.completions.create(model="held", messages=MESSAGES).choices
    assert time.monotonic() - t0 < LIMIT
    assert env.counts() == (2, 0) and env.only_row().deployment == "spare-a"
    env.reset().a.fail_next(hold)
    assert _timed_out(client, model="held-lone") < LIMIT
    assert env.counts() == (1, 0) and env.only_row().status == 504
    with pytest.raises(openai.RateLimitError) as err:  # the next one is told how long the hold has left
        client.chat.completions.create(model="held-lone", messages=MESSAGES)
    assert 1 <= int(err.value.response.headers["retry-after"]) <= 3 and env.counts() == (1, 0)


def test_a_deployment_that_never_answers_in_the_whole_time_has_its_circuit_opened(
        env: Env, client: openai.OpenAI) -> None:
    """Its own 30 s would never cut it before the group's 1 s: each attempt that had the request's whole
    time and was cut counts as its timeout, so its circuit opens and the healthy one serves."""
    env.a.options.latency = 30  # accepts, and answers nothing
    for _ in range(BREAKER["failures"]):
        _timed_out(client, model="stuck")
    assert env.state("stuck-a") == "open"
    assert client.chat.completions.create(model="stuck", messages=MESSAGES).choices
    assert env.counts() == (2, 1)  # not sent to the hanging one again


def test_an_attempt_left_only_the_end_of_the_time_is_not_blamed(env: Env, client: openai.OpenAI) -> None:
    """The first deployment's slow 503 spent most of the request's time; cut, the second is no failure
    (one would open its circuit) and serves the next request."""
    env.a.fail_next(Fault(status=503, delay=0.7))
    env.b.options.latency = 30
    _timed_out(client, model="late")
    assert env.counts() == (1, 1)
    assert (env.state("late-a"), env.state("late-b")) == ("open", "healthy")
    env.b.options.latency = 0
    assert client.chat.completions.create(model="late", messages=MESSAGES).choices
    assert env.counts() == (1, 2)


@pytest.mark.parametrize("value", [0, -1, "soon", 86401, float("inf"), float("nan")])
def test_a_bad_timeout_is_a_config_error_naming_it(value: object) -> None:
    model = {"name": "a", "timeout": value, "deployments": [{"provider": "openai", "model": "m"}]}
    with pytest.raises(ConfigError, match=rf"^config error at {re.escape('models[0].timeout')}: Expected `float"):
        parse_settings({"models": [model]}, env={})
