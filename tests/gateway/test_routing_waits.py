"""How long the router waits, and tells the client to wait, when an upstream says how long it is
closed: a 503's ``Retry-After``, a 429 naming only when its used-up limit resets, an absurd wait."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.contracts import Principal
from gateway.routing.plan import MAX_HOLD_OFF
from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, client, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "wait for it"}]
NO_REQUESTS_LEFT = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s",
                    "x-ratelimit-remaining-tokens": "90000", "x-ratelimit-reset-tokens": "6ms"}


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [
        group("resting", dep("re-a", a), max_retries=1),
        group("absurd", dep("ab-a", a)),
        group("spent", dep("sp-a", a), dep("sp-b", b)),
        group("spent-lone", dep("sl-a", a)),
        group("timed", dep("ti-a", a), dep("ti-b", b)),
        group("big", dep("bg-a", a), max_retries=0, fallbacks=["small"],
              circuit={"failures": 1, "window": 60, "cooldown": 30}),
        group("small", dep("sm-b", b, context_window=200)),
        group("narrow", dep("na-a", a, context_window=200), max_retries=0),
        group("broken", dep("br-a", a), max_retries=0, circuit={"failures": 1, "window": 60, "cooldown": 30}),
        group("own-circuit", dep("oc-a", a), max_retries=0, circuit={"failures": 2, "window": 60, "cooldown": 60}),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    tenants = {f"sk-{t}": Principal(key_id=f"key-{t}", tenant_id=t) for t in ("t1", "t2")}
    with routing_gateway(_models, keys=tenants) as env:
        yield env


def test_a_503s_retry_after_is_waited_before_retrying_its_deployment(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=503, headers={"retry-after": "1"}))
    t0 = time.monotonic()
    assert client.chat.completions.create(model="resting", messages=MESSAGES).choices
    assert time.monotonic() - t0 >= 0.9  # not sent again 10 ms later
    assert env.counts() == (2, 0)
    assert (env.only_row().status, env.only_row().deployment) == (200, "re-a")


def test_the_first_answer_to_an_absurd_retry_after_tells_the_wait_the_router_keeps(env: Env,
                                                                                  client: openai.OpenAI) -> None:
    """The deployment is held off for at most ``MAX_HOLD_OFF``: the client is not told to come back in
    a thousand years (a 301-digit header) by the request that met the 429 either."""
    env.a.fail_next(Fault(status=429, headers={"retry-after": "1e300"}))
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="absurd", messages=MESSAGES)
    assert 1 <= int(caught.value.response.headers["retry-after"]) <= MAX_HOLD_OFF
    assert env.counts() == (1, 0)


def test_a_429_naming_only_when_its_requests_reset_holds_the_deployment_off(env: Env, client: openai.OpenAI) -> None:
    """OpenAI's 429 for requests per minute may carry no ``Retry-After``, only
    ``x-ratelimit-reset-requests``: the deployment takes no request until then, as a success saying
    no request is left steers them away."""
    env.a.fail_next(Fault(status=429, headers=NO_REQUESTS_LEFT), Fault(status=429, headers=NO_REQUESTS_LEFT))
    for _ in range(3):
        assert client.chat.completions.create(model="spent", messages=MESSAGES).choices
    assert env.counts() == (1, 3)
    assert env.state("sp-a") == "held"


def test_a_lone_deployment_out_of_requests_is_a_429_telling_when_they_reset(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers=NO_REQUESTS_LEFT))
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="spent-lone", messages=MESSAGES)
    assert time.monotonic() - t0 < 2 and env.counts() == (1, 0)  # not retried into the same wall
    assert 19 <= int(caught.value.response.headers["retry-after"]) <= 20


def test_a_tenant_refused_by_its_own_open_circuit_is_told_when_it_closes(env: Env) -> None:
    """The 503 says how long the tenant is refused: its ``Retry-After`` too, so that an SDK waits
    that out instead of spending its retries on the same refusal."""
    one, two = (openai.OpenAI(base_url=env.server.url + "/v1", api_key=f"sk-{t}", max_retries=0) for t in ("t1", "t2"))
    assert two.chat.completions.create(model="own-circuit", messages=MESSAGES).choices
    env.a.fail_next(Fault(status=500), Fault(status=500))
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            one.chat.completions.create(model="own-circuit", messages=MESSAGES)
    with pytest.raises(openai.InternalServerError) as caught:
        one.chat.completions.create(model="own-circuit", messages=MESSAGES)
    assert caught.value.status_code == 503 and "60 s" in caught.value.message
    assert 59 <= int(caught.value.response.headers["retry-after"]) <= 60
    assert env.counts() == (3, 0)


def test_a_model_whose_circuits_are_all_open_is_a_503_telling_when_one_half_opens(env: Env,
                                                                                 client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=500))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="broken", messages=MESSAGES)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="broken", messages=MESSAGES)
    assert caught.value.status_code == 503 and "'broken'" in caught.value.message
    assert 29 <= int(caught.value.response.headers["retry-after"]) <= 30
    assert env.counts() == (1, 0)


def _latency_ms(env: Env, deployment: str) -> float:
    rows = httpx.get(env.server.url + "/admin/v1/deployments", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    return next(r["latency_ewma_ms"] for r in rows.json()["data"] if r["deployment"] == deployment)


def test_an_upstreams_quick_408_does_not_make_its_deployment_look_fast(env: Env, client: openai.OpenAI) -> None:
    """A timeout counts as at least that slow for ``lowest_latency``; an upstream answering 408 at
    once timed nothing out of ours: a deployment failing so must not become the fastest."""
    env.a.options.latency = 0.3
    assert client.chat.completions.create(model="timed", messages=MESSAGES).choices
    measured = _latency_ms(env, "ti-a")
    assert measured >= 300
    env.a.fail_next(*[Fault(status=408)] * 3)
    for _ in range(3):
        assert client.chat.completions.create(model="timed", messages=MESSAGES).choices
    assert env.counts() == (4, 3)
    assert _latency_ms(env, "ti-a") >= measured


def test_a_model_whose_circuits_are_open_is_not_refused_for_a_fallbacks_context_window(env: Env,
                                                                                      client: openai.OpenAI) -> None:
    """The model asked for is out of service for a while and its fallback's context is too small
    for this prompt: the prompt is not too long for the model (a 400 the client cannot get past),
    the model is unavailable (a 503 saying when to try again)."""
    env.a.fail_next(Fault(status=500))
    assert client.chat.completions.create(model="big", messages=MESSAGES).choices  # the fallback served it
    long: Any = [{"role": "user", "content": "word " * 1000}]
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="big", messages=long)
    assert caught.value.status_code == 503 and caught.value.code == "upstream_unavailable"
    assert 29 <= int(caught.value.response.headers["retry-after"]) <= 30
    assert env.counts() == (1, 1)


def test_a_prompt_too_long_for_a_held_off_deployment_is_a_400_not_a_wait(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=429, headers={"retry-after": "3"}))
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="narrow", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as caught:  # no wait makes it fit
        client.chat.completions.create(model="narrow", messages=[{"role": "user", "content": "word " * 1000}])
    assert caught.value.code == "context_length_exceeded"
    assert env.counts() == (1, 0)
