"""The gateway's retries and the SDK's do not multiply: a failure the gateway already retried
(``max_retries``, fallbacks) tells the official SDK not to retry it again (``x-should-retry:
false``), so a client with the SDK's default two retries sends the upstreams the gateway's attempts,
not three times them. A failure the gateway did not retry (no retries configured) is left to the
SDK, and so is one whose upstream asked for a wait (``retry-after``). Real loopback upstreams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "retry me"}]
DOWN = Fault(status=500)


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [
        group("retried", dep("re-a", a), dep("re-b", b)),  # three attempts
        group("fell", dep("fe-a", a), max_retries=0, fallbacks=["spare"]),
        group("spare", dep("sp-b", b), max_retries=0),
        group("single", dep("si-a", a), max_retries=0),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    with routing_gateway(_models) as env:
        yield env


def _sdk(env: Env) -> openai.OpenAI:
    """A client as users have it: the SDK's default two retries (their waits kept short)."""
    client = openai.OpenAI(base_url=env.server.url + "/v1", api_key=ADMIN_KEY, max_retries=2)
    return client.with_options(timeout=20)


@pytest.fixture(autouse=True)
def _short_sdk_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai._base_client, "INITIAL_RETRY_DELAY", 0.01)
    monkeypatch.setattr(openai._base_client, "MAX_RETRY_DELAY", 0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_a_failure_the_gateway_retried_is_not_retried_by_the_sdk(env: Env, stream: bool) -> None:
    env.a.fail_next(*[DOWN] * 9)
    env.b.fail_next(*[DOWN] * 9)
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(env).chat.completions.create(model="retried", messages=MESSAGES, stream=stream)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert sum(env.counts()) == 3  # the gateway's three attempts, once
    assert len(env.usage.wait_for(1)) == 1


def test_a_failure_after_a_fallback_is_not_retried_by_the_sdk(env: Env) -> None:
    env.a.fail_next(*[DOWN] * 3)
    env.b.fail_next(*[DOWN] * 3)
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(env).chat.completions.create(model="fell", messages=MESSAGES)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert env.counts() == (1, 1)


def test_a_failure_the_gateway_did_not_retry_is_left_to_the_sdk(env: Env) -> None:
    env.a.fail_next(*[DOWN] * 3)
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(env).chat.completions.create(model="single", messages=MESSAGES)
    assert "x-should-retry" not in caught.value.response.headers
    assert env.counts() == (3, 0)  # the SDK's own three tries


def test_a_retried_failure_asking_for_a_wait_is_left_to_the_sdk(env: Env) -> None:
    """The upstream's Retry-After outlasts what the gateway waits out: the client may wait it."""
    env.a.fail_next(DOWN, Fault(status=429, headers={"retry-after": "1"}))
    env.b.fail_next(DOWN)
    reply = _sdk(env).chat.completions.create(model="retried", messages=MESSAGES)
    assert reply.choices[0].message.content == "retry me"
    assert env.counts() == (3, 1)  # the gateway's three attempts, then the SDK's retry after the wait
