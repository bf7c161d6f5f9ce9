"""``lowest_latency`` across real loopback upstreams: a deployment that starts timing out is no longer
taken for the fast one it was (a timeout is no answer, but it took that long at least)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import ADMIN_KEY
from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, dep, group, routing_gateway

MESSAGES: Any = [{"role": "user", "content": "route me"}]
FIRST_BYTE = 0.5  # deployment la's first-byte timeout


def _models(a: str, b: str) -> list[dict[str, Any]]:
    return [group("quick", dep("la", a, timeouts={"connect": 1, "first_byte": FIRST_BYTE, "total": 5}), dep("lb", b),
                  strategy="lowest_latency", max_retries=1, circuit={"failures": 100, "window": 60, "cooldown": 60})]


@pytest.fixture
def env() -> Iterator[Env]:
    with routing_gateway(_models) as env:
        yield env


def _stream(client: openai.OpenAI) -> str:
    chunks = list(client.chat.completions.create(model="quick", messages=MESSAGES, stream=True))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_deployment_that_starts_timing_out_stops_being_first(env: Env) -> None:
    client = openai.OpenAI(base_url=env.server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
    env.b.fail_next(*[Fault(delay=0.05)] * 3)  # lb is measured the slower, about 50 ms to la's few
    for _ in range(10):  # unmeasured deployments go first: both are measured within a few requests
        if min(env.counts()) > 0:
            break
        assert _stream(client) == "route me"
    assert min(env.counts()) > 0
    env.a.fail_next(*[Fault(delay=2 * FIRST_BYTE)] * 40)  # from now on la answers after its first-byte timeout
    for _ in range(10):  # the fast one is taken first (bar exploration) and times out once
        if len(env.a.received) > 1:
            break
        assert _stream(client) == "route me"  # lb serves it after the timeout
    assert len(env.a.received) > 1
    before = len(env.a.received)
    for _ in range(20):
        assert _stream(client) == "route me"
    # only exploration (10 % of the requests, la first in half of those) reaches la now; before, every one did
    assert len(env.a.received) - before <= 8
