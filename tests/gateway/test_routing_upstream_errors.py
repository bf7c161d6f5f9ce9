"""What an upstream's failure becomes for the client and the router: a 409 (OpenAI's transient
conflict) retried and passed on, a 404 not about the model (a wrong ``api_base``) against the
circuit, and messages that never name a deployment or its address (its logs, traces and usage row do)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, client, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "hello"}]
ONE_STRIKE = {"failures": 1, "window": 60, "cooldown": 30}
CONFLICT = {"error": {"message": "Another request is updating this resource; try again.",
                      "type": "invalid_request_error", "param": None, "code": "conflict"}}


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [
        group("conflicted", dep("internal-east.corp-7", a), circuit=ONE_STRIKE),
        group("conflicted-pair", dep("cp-a", a), dep("cp-b", b), max_retries=1),
        group("misrouted-0", dep("mr-a.internal-0", a), max_retries=0, circuit=ONE_STRIKE),
        group("misrouted-1", dep("mr-a.internal-1", a), max_retries=0, circuit=ONE_STRIKE),
        group("gone", dep("gone-a.internal", "http://127.0.0.1:9"), max_retries=0),
        group("unknown-model", dep("um-a.internal", a), max_retries=0, circuit=ONE_STRIKE),
        group("slow", dep("slow-a.internal", a, timeouts={"connect": 1, "first_byte": 0.3, "total": 0.5}),
              max_retries=0),
        group("stream-slow", dep("ss-a.internal", a, timeouts={"connect": 1, "first_byte": 0.3, "total": 5}),
              max_retries=0),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    with routing_gateway(_models) as env:
        yield env


def test_a_409_is_retried_on_the_next_attempt_without_blaming_the_deployment(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=409, body=CONFLICT))
    assert client.chat.completions.create(model="conflicted-pair", messages=MESSAGES).choices
    assert env.counts() == (1, 1)
    env.reset()
    env.a.fail_next(Fault(status=409, body=CONFLICT))
    assert client.chat.completions.create(model="conflicted", messages=MESSAGES).choices
    assert env.counts() == (2, 0)
    assert env.state("internal-east.corp-7") == "healthy"  # one strike would have opened it


def test_a_409_on_every_attempt_reaches_the_client_as_a_409_with_its_message(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(*[Fault(status=409, body=CONFLICT)] * 3)
    with pytest.raises(openai.ConflictError) as caught:
        client.chat.completions.create(model="conflicted", messages=MESSAGES)
    assert caught.value.status_code == 409 and "try again" in caught.value.message
    assert env.counts() == (3, 0)
    assert env.state("internal-east.corp-7") == "healthy"
    assert env.only_row().status == 409


@pytest.mark.parametrize(("case", "body"), enumerate([{"detail": "Not Found"},
                                  b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1>"
                                  b"<p>The requested URL /v1/v1/chat/completions was not found on mr-a.internal:8000"
                                  b"</p></body></html>"]))
def test_a_404_not_about_the_model_is_a_502_against_the_circuit(env: Env, client: openai.OpenAI, case: int,
                                                                 body: Any) -> None:
    env.a.fail_next(Fault(status=404, body=body))
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=f"misrouted-{case}", messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "bad_upstream_response"
    for leaked in ("mr-a", "internal", "/v1/v1", "127.0.0.1", "<html"):
        assert leaked not in caught.value.message
    assert env.state(f"mr-a.internal-{case}") == "open"  # a misconfigured deployment: out of service for the cooldown


def test_a_404_model_not_found_is_the_readmes_upstream_model_not_found(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(Fault(status=404, body={"error": {
        "message": "The model `m` does not exist or you do not have access to it.", "type": "invalid_request_error",
        "param": None, "code": "model_not_found"}}))
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="unknown-model", messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "upstream_model_not_found"
    assert "um-a" not in caught.value.message
    assert env.state("um-a.internal") == "open"


@pytest.mark.parametrize("model", ["slow", "stream-slow"])
def test_a_timeout_does_not_name_the_deployment(env: Env, client: openai.OpenAI, model: str) -> None:
    env.a.fail_next(Fault(delay=1.0))
    with pytest.raises(openai.APIStatusError) as caught:
        if model == "slow":
            client.chat.completions.create(model=model, messages=MESSAGES)
        else:
            for _ in client.chat.completions.create(model=model, messages=MESSAGES, stream=True):
                pass
    assert caught.value.status_code == 504
    assert ".internal" not in caught.value.message and "did not answer" in caught.value.message


def test_an_unreachable_upstream_does_not_name_the_deployment(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="gone", messages=MESSAGES)
    assert caught.value.status_code == 503 and "unreachable" in caught.value.message
    assert "gone-a" not in caught.value.message and "127.0.0.1" not in caught.value.message
