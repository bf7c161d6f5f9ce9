"""Failures the router moves past, across real loopback upstreams: a deployment whose upstream does
not know its model, a stream whose first event is an error, a 429 asking for a longer wait than
the router waits out. Each client request leaves exactly one usage row."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from gateway.contracts import Principal
from gateway.routing.plan import MAX_HOLD_OFF
from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, client, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "route me"}]
ABSURD_WAITS = ["1e300", "86400000"]  # Retry-After values no deployment should be held off for
TENANTS = ("t1", "t2", "t3")
UNKNOWN_MODEL = Fault(status=404, body={"error": {"message": "The model `m` does not exist",
                                                  "type": "invalid_request_error", "code": "model_not_found"}})


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [
        group("misconfigured", dep("mc-a", a), dep("mc-b", b)),
        group("counted", dep("ct-a", a), dep("ct-b", b), circuit={"failures": 2, "window": 60, "cooldown": 60}),
        group("lost", dep("lo-a", a), max_retries=0, fallbacks=["backup"]),
        group("backup", dep("bk-b", b), max_retries=0),
        group("unknown", dep("un-a", a)),
        group("streamed", dep("st-a", a), dep("st-b", b)),
        group("limited", dep("li-a", a), dep("li-b", b)),
        group("lone", dep("ln-a", a)),
        group("spilling", dep("sp-a", a), fallbacks=["backup"]),
        group("absurd", dep("ab-a", a)),
        *(group(f"held-{wait}", dep(f"held-{wait}-a", a)) for wait in ABSURD_WAITS),
        group("sized", dep("sz-a", a), dep("sz-b", b)),  # each 429 test its own group: hold-offs last
        group("sized-lone", dep("sl-a", a)),
        group("sized-soon", dep("ss-a", a)),
        group("soon", dep("so-a", a), dep("so-b", b)),
        group("soon-lone", dep("sn-a", a)),
        group("waited", dep("wt-a", a), max_retries=1),
        *(group(f"used-{i}", dep(f"used-{i}-a", a), dep(f"used-{i}-b", b)) for i in range(4)),
        group("bare", dep("ba-a", a), dep("ba-b", b)),
        group("bare-shared", dep("bs-a", a), dep("bs-b", b)),
        group("tight", dep("ti-a", a), dep("ti-b", b)),
        group("tight-lone", dep("tl-a", a)),
        group("own-circuit", dep("oc-a", a), dep("oc-b", b), max_retries=0,
               circuit={"failures": 2, "window": 60, "cooldown": 60}),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    tenants = {f"sk-{t}": Principal(key_id=f"key-{t}", tenant_id=t) for t in TENANTS}
    with routing_gateway(_models, keys=tenants) as env:
        yield env

def _tenant(env: Env, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.server.url + "/v1", api_key=f"sk-{tenant}", max_retries=0)


# ---------------------------------------------------------------- the upstream does not know the model


def test_an_unknown_model_moves_to_the_next_deployment(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(UNKNOWN_MODEL)
    reply = client.chat.completions.create(model="misconfigured", messages=MESSAGES)
    assert reply.choices[0].message.content == "route me" and reply.model == "misconfigured"
    assert env.counts() == (1, 1)
    row = env.only_row()
    assert (row.status, row.error_type, row.deployment) == (200, None, "mc-b")


def test_an_unknown_model_counts_against_the_deployments_circuit(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(UNKNOWN_MODEL, UNKNOWN_MODEL)
    for _ in range(2):
        assert client.chat.completions.create(model="counted", messages=MESSAGES).choices
    assert env.state("ct-a") == "open" and env.counts() == (2, 2)
    assert client.chat.completions.create(model="counted", messages=MESSAGES).choices
    assert env.counts() == (2, 3)  # the open deployment gets no traffic


def test_an_unknown_model_falls_back_to_the_fallbackgroup(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(UNKNOWN_MODEL)
    assert client.chat.completions.create(model="lost", messages=MESSAGES).model == "lost"
    assert env.counts() == (1, 1)
    assert env.only_row().deployment == "bk-b"


def test_an_unknown_model_everywhere_is_a_502(env: Env, client: openai.OpenAI) -> None:
    """The client named a model the gateway serves: not its 404, but the gateway's upstream failing it."""
    env.a.fail_next(UNKNOWN_MODEL)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="unknown", messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "upstream_model_not_found"
    assert caught.value.body["type"] == "upstream_error" and "does not exist" in caught.value.message  # type: ignore[index]
    assert env.counts() == (1, 0)  # not retried where it cannot succeed
    row = env.only_row()
    assert (row.status, row.error_type, row.deployment) == (502, "model_not_found", "un-a")


# ---------------------------------------------------------------- a stream whose first event is an error


def _first_event(error: dict[str, Any]) -> Fault:
    """A 200 stream whose only event is ``{"error": error}``."""
    return Fault(status=200, headers={"content-type": "text/event-stream"},
                 body=b"data: " + json.dumps({"error": error}).encode() + b"\n\n")


@pytest.mark.parametrize("fault", [
    _first_event({"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"}),
    _first_event({"message": "Overloaded", "type": "overloaded_error"}),
    _first_event({"object": "error", "message": "engine died", "type": "InternalServerError", "code": 500}),
    Fault(error_after_chunks=0),  # the fake upstream's own error event (server_error), before any chunk
], ids=["rate-limited", "overloaded", "vllm-500", "server-error"])
def test_a_first_event_error_is_retried_on_the_next_deployment(env: Env, client: openai.OpenAI,
                                                                fault: Fault) -> None:
    env.a.fail_next(fault)
    chunks = list(client.chat.completions.create(model="streamed", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "route me"
    assert env.counts() == (1, 1)
    row = env.only_row()
    assert (row.status, row.error_type, row.deployment, row.extra) == (200, None, "st-b", {"outcome": "completed"})


def test_a_first_event_naming_the_requests_fault_is_a_400_not_retried(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(_first_event({"message": "bad logit_bias", "type": "BadRequestError", "param": "logit_bias",
                                  "code": 400}))
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="streamed", messages=MESSAGES, stream=True)
    assert caught.value.body["param"] == "logit_bias"  # type: ignore[index]
    assert env.counts() == (1, 0)
    row = env.only_row()
    assert (row.status, row.error_type) == (400, "invalid_request_error")


# ---------------------------------------------------------------- a 429 asking for a long wait


def test_a_long_retry_after_holds_the_deployment_off(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers={"retry-after": "30"}))
    t0 = time.monotonic()
    assert client.chat.completions.create(model="limited", messages=MESSAGES).choices
    assert time.monotonic() - t0 < 2 and env.counts() == (1, 1)  # moved on at once
    assert env.only_row().deployment == "li-b"
    for _ in range(3):  # the priority deployment asked for 30 s without requests
        assert client.chat.completions.create(model="limited", messages=MESSAGES).choices
    assert env.counts() == (1, 4)


def test_a_long_retry_after_falls_back(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers={"retry-after": "30"}))
    assert client.chat.completions.create(model="spilling", messages=MESSAGES).model == "spilling"
    assert env.counts() == (1, 1)


def test_a_long_retry_after_with_nothing_left_is_a_429_carrying_it(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers={"retry-after": "30"}))
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="lone", messages=MESSAGES)
    assert time.monotonic() - t0 < 2  # not retried after the router's longest backoff
    response = caught.value.response
    assert response.headers["retry-after"] == "30" and caught.value.code == "upstream_rate_limited"
    assert caught.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    assert (env.only_row().status, env.only_row().error_type) == (429, "rate_limited")
    with pytest.raises(openai.RateLimitError) as again:  # the upstream is not asked again before its time
        client.chat.completions.create(model="lone", messages=MESSAGES)
    assert 28 <= int(again.value.response.headers["retry-after"]) <= 30
    assert env.counts() == (1, 0)
    assert [(r.status, r.error_type) for r in env.usage.wait_for(2)] == [(429, "rate_limited")] * 2


def test_a_short_retry_after_holds_the_deployment_off_for_the_others(env: Env, client: openai.OpenAI) -> None:
    """A limit used up with a wait of a second: the next requests go straight to the other
    deployment for that second (none spends a round trip on a 429 first), then the first serves again."""
    env.a.fail_next(Fault(status=429, headers={"retry-after": "1", "x-ratelimit-remaining-requests": "0"}))
    t0 = time.monotonic()
    for _ in range(3):
        assert client.chat.completions.create(model="soon", messages=MESSAGES).choices
    assert time.monotonic() - t0 < 0.8 and env.counts() == (1, 3)
    assert env.state("so-a") == "held"
    time.sleep(max(0.0, 1.05 - (time.monotonic() - t0)))
    assert client.chat.completions.create(model="soon", messages=MESSAGES).choices
    assert env.counts() == (2, 3)  # the priority deployment again


def test_a_short_retry_after_with_nothing_else_is_waited_out_by_every_request(env: Env, client: openai.OpenAI) -> None:
    """The one deployment asked for a second without requests: the request that met the 429 and
    one that came meanwhile both wait it out and are served, and neither reaches the upstream before."""
    env.a.fail_next(Fault(status=429, headers={"retry-after": "1"}))
    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        first = pool.submit(client.chat.completions.create, model="soon-lone", messages=MESSAGES)
        while not env.a.received:
            time.sleep(0.01)
        time.sleep(0.1)  # the 429 is back at the gateway
        assert client.chat.completions.create(model="soon-lone", messages=MESSAGES).choices
        second_done = time.monotonic() - t0
        assert first.result(timeout=10).choices
    assert second_done >= 0.9  # waited for the hold to end, not sent at once
    assert env.counts() == (3, 0)  # the 429, then each request once
    assert [r.status for r in env.usage.wait_for(2)] == [200, 200]


def test_a_wait_the_event_loop_ends_early_still_waits_the_hold_out(env: Env, client: openai.OpenAI) -> None:
    """uvloop's timers have millisecond resolution, so a sleep may end a little before the hold it
    waits out: the request is still sent there (once the hold is over), not failed as unavailable."""
    for _ in range(20):
        env.a.fail_next(Fault(status=429, headers={"retry-after-ms": "50"}))
        assert client.chat.completions.create(model="waited", messages=MESSAGES).choices


TOO_LARGE = {"retry-after": "30", "x-ratelimit-remaining-requests": "499", "x-ratelimit-remaining-tokens": "2000"}


def test_a_429_for_this_request_alone_holds_nothing_off(env: Env, client: openai.OpenAI) -> None:
    """Some of every limit left (OpenAI's "Request too large", or more tokens than are left now): the
    request goes to the next deployment, and the refusing one keeps serving the others."""
    env.a.fail_next(Fault(status=429, headers=TOO_LARGE))
    assert client.chat.completions.create(model="sized", messages=MESSAGES).choices
    assert env.counts() == (1, 1) and env.only_row().deployment == "sz-b"
    assert env.state("sz-a") == "healthy"
    assert client.chat.completions.create(model="sized", messages=MESSAGES).choices
    assert env.counts() == (2, 1)  # the priority deployment again


def test_a_429_for_this_request_alone_is_not_retried_on_its_deployment(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers=TOO_LARGE, body={"error": {
        "message": "Request too large for m on tokens per min (TPM): Limit 30000, Requested 50000.",
        "type": "tokens", "code": "rate_limit_exceeded"}}))
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="sized-lone", messages=MESSAGES)
    assert time.monotonic() - t0 < 2 and env.counts() == (1, 0)  # neither waited out nor sent again
    assert "Request too large" in caught.value.message
    assert client.chat.completions.create(model="sized-lone", messages=MESSAGES).choices  # not held off
    assert env.counts() == (2, 0)


def test_a_429_for_this_request_alone_asking_a_short_wait_is_retried_there(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers=TOO_LARGE | {"retry-after": "0.2"}))
    assert client.chat.completions.create(model="sized-soon", messages=MESSAGES).choices
    assert env.counts() == (2, 0)  # waited out and sent again: the tokens it lacked may be back


BARE = Fault(status=429, headers={"retry-after": "30"})  # as Azure's: a wait, nothing said of the limits


def test_a_bare_429_holds_the_deployment_off_for_its_tenant_alone(env: Env, client: openai.OpenAI) -> None:
    """A 429 that says nothing of the deployment's limits may be about one tenant's (or key's) own
    quota upstream, or its one request: that tenant's requests go elsewhere for its Retry-After,
    the other tenants' are still sent there."""
    env.a.fail_next(BARE)
    one, two = _tenant(env, "t1"), _tenant(env, "t2")
    assert one.chat.completions.create(model="bare", messages=MESSAGES).choices
    assert env.counts() == (1, 1)
    assert two.chat.completions.create(model="bare", messages=MESSAGES).choices
    assert env.counts() == (2, 1) and env.state("ba-a") == "healthy"
    assert one.chat.completions.create(model="bare", messages=MESSAGES).choices
    assert env.counts() == (2, 2)  # the tenant that met the 429 is not sent there before its wait


def test_bare_429s_of_two_tenants_hold_the_deployment_off_for_everyone(env: Env, client: openai.OpenAI) -> None:
    """Two tenants meet a bare 429 with nobody served there in between: a limit of the deployment's."""
    env.a.fail_next(BARE, BARE)
    for tenant in ("t1", "t2"):
        assert _tenant(env, tenant).chat.completions.create(model="bare-shared", messages=MESSAGES).choices
    assert env.counts() == (2, 2) and env.state("bs-a") == "held"
    assert _tenant(env, "t3").chat.completions.create(model="bare-shared", messages=MESSAGES).choices
    assert env.counts() == (2, 3)


def test_a_tenants_own_open_circuit_sends_its_requests_to_the_other_deployment(env: Env,
                                                                                client: openai.OpenAI) -> None:
    """One tenant's requests failed twice where another's were served: its own circuit on the
    deployment opens, and its next request goes to the other deployment (it was refused with a
    503 when the group had no retry left)."""
    one, two = _tenant(env, "t1"), _tenant(env, "t2")
    assert two.chat.completions.create(model="own-circuit", messages=MESSAGES).choices
    env.a.fail_next(Fault(status=500), Fault(status=500))
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            one.chat.completions.create(model="own-circuit", messages=MESSAGES)
    assert env.state("oc-a") == "healthy" and env.counts() == (3, 0)
    assert one.chat.completions.create(model="own-circuit", messages=MESSAGES).choices
    assert env.counts() == (3, 1)
    assert two.chat.completions.create(model="own-circuit", messages=MESSAGES).choices
    assert env.counts() == (4, 1)


TOKENS_LOW = {"x-ratelimit-remaining-requests": "499", "x-ratelimit-remaining-tokens": "300",
              "x-ratelimit-reset-tokens": "1m30s"}


def test_a_deployment_short_of_tokens_gets_the_requests_that_fit(env: Env, client: openai.OpenAI) -> None:
    """Its upstream said 300 tokens are left this minute: a request reserving more (its prompt and
    max_tokens) goes to the other deployment until the reset, a small one is still sent there, and
    where no other deployment can take it, a large one is sent there all the same."""
    env.a.fail_next(Fault(status=429, headers=TOKENS_LOW))
    assert client.chat.completions.create(model="tight", messages=MESSAGES, max_tokens=1000).choices
    assert env.counts() == (1, 1)
    assert client.chat.completions.create(model="tight", messages=MESSAGES, max_tokens=1000).choices
    assert env.counts() == (1, 2)  # not sent where it would meet the same 429
    assert client.chat.completions.create(model="tight", messages=MESSAGES, max_tokens=100).choices
    assert env.counts() == (2, 2) and env.state("ti-a") == "healthy"
    env.a.fail_next(Fault(status=429, headers=TOKENS_LOW))
    assert client.chat.completions.create(model="tight-lone", messages=MESSAGES, max_tokens=1000).choices
    assert env.counts() == (4, 2)  # the upstream's count may be below the reservation: retried there


OUT_OF_CREDIT = {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                           "code": "insufficient_quota"}}


@pytest.mark.parametrize(("group", "left", "body"), [
    (0, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "2000"}, None),
    (1, {"anthropic-ratelimit-requests-remaining": "10", "anthropic-ratelimit-input-tokens-remaining": "0"}, None),
    (2, {"x-ratelimit-remaining-tokens": "lots"}, None),
    (3, {"x-ratelimit-remaining-requests": "499", "x-ratelimit-remaining-tokens": "2000"}, OUT_OF_CREDIT),
], ids=["openai-requests", "anthropic-input-tokens", "not-a-number", "out-of-credit"])
def test_a_429_with_a_limit_used_up_holds_the_deployment_off(env: Env, client: openai.OpenAI, group: int,
                                                             left: dict[str, str], body: Any) -> None:
    env.a.fail_next(Fault(status=429, headers={"retry-after": "30"} | left, body=body))
    assert client.chat.completions.create(model=f"used-{group}", messages=MESSAGES).choices
    assert env.state(f"used-{group}-a") == "held"
    assert client.chat.completions.create(model=f"used-{group}", messages=MESSAGES).choices
    assert env.counts() == (1, 2)


# ---------------------------------------------------------------- odd Retry-After values, a first chunk saying error


@pytest.mark.parametrize("headers", [{"retry-after": "inf"}, {"retry-after": "Infinity"}, {"retry-after": "1e400"},
                                     {"retry-after-ms": "inf"}], ids=["inf", "Infinity", "1e400", "ms-inf"])
def test_an_infinite_retry_after_is_ignored(env: Env, client: openai.OpenAI, headers: dict[str, str]) -> None:
    """Not a delay in seconds: the 429 is retried as one without Retry-After (it was a 500, and
    would have held the deployment off for good)."""
    env.a.fail_next(Fault(status=429, headers=headers))
    assert client.chat.completions.create(model="absurd", messages=MESSAGES).choices
    assert env.counts() == (2, 0)
    assert (env.only_row().status, env.only_row().error_type) == (200, None)


@pytest.mark.parametrize("wait", ABSURD_WAITS)
def test_an_absurd_retry_after_holds_off_for_a_bounded_time(env: Env, client: openai.OpenAI, wait: str) -> None:
    env.a.fail_next(Fault(status=429, headers={"retry-after": wait}))
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=f"held-{wait}", messages=MESSAGES)
    with pytest.raises(openai.RateLimitError) as again:  # held off, but not for days
        client.chat.completions.create(model=f"held-{wait}", messages=MESSAGES)
    assert MAX_HOLD_OFF - 2 <= int(again.value.response.headers["retry-after"]) <= MAX_HOLD_OFF
    assert env.counts() == (1, 0)
    assert [(r.status, r.error_type) for r in env.usage.wait_for(2)] == [(429, "rate_limited")] * 2


def test_a_first_chunk_saying_error_is_relayed(env: Env, client: openai.OpenAI) -> None:
    """A first event that merely contains the word (the text "error") is the answer, not a failure."""
    chunks = list(client.completions.create(model="absurd", prompt="error", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "error"
    assert env.counts() == (1, 0)
    assert env.only_row().error_type is None
