"""Property-based fuzz of chat and completion bodies: whatever arrives (deep nesting, huge strings,
wrong types, invalid UTF-8, NaN, negative and enormous numbers), the answer is a success or a 4xx
with an OpenAI error body, never a 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv
from tests.support.fake_upstream import FakeUpstream

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 1e308, -1e308, 0.5]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=40), st.sampled_from(["", "x" * 100_000]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                              st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=20)
messages = st.one_of(
    json_values,
    st.lists(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]),
                                                      json_values),
                                    "content": st.one_of(st.text(max_size=50), json_values)}), max_size=3),
)
CHAT_FIELDS = {
    "model": st.one_of(st.just("echo"), json_values), "messages": messages, "temperature": numbers,
    "top_p": numbers, "max_tokens": numbers, "max_completion_tokens": numbers, "n": numbers,
    "stream": st.one_of(st.booleans(), json_values), "stop": json_values, "tools": json_values,
    "tool_choice": json_values, "response_format": json_values, "logprobs": json_values,
    "top_logprobs": numbers, "seed": numbers, "stream_options": json_values, "logit_bias": json_values,
    "presence_penalty": numbers, "user": json_values,
}
chat_bodies = st.fixed_dictionaries({"model": st.just("echo"), "messages": messages},
                                    optional={k: v for k, v in CHAT_FIELDS.items() if k not in ("model", "messages")})


def deep(depth: int) -> str:
    return '{"model": "echo", "messages": ' + "[" * depth + "]" * depth + "}"


raw_bodies = st.one_of(
    st.binary(max_size=200),  # mostly invalid UTF-8 and not JSON at all
    st.builds(lambda b: b'{"model": "echo", "messages": [{"role": "user", "content": "' + b + b'"}]}',
              st.binary(min_size=1, max_size=30)),  # invalid UTF-8 inside a string
    st.integers(min_value=1, max_value=5000).map(lambda d: deep(d).encode()),
)


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert set(error) <= {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def http(gateway_env: GatewayEnv) -> Any:
    with httpx.Client(base_url=gateway_env.server.url, timeout=20,
                      headers={"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}) as client:
        yield client


@FUZZ
@given(body=chat_bodies)
def test_fuzzed_chat_bodies(http: httpx.Client, upstream: FakeUpstream, body: dict[str, Any]) -> None:
    check(http.post("/v1/chat/completions", content=json.dumps(body, allow_nan=True)))


@FUZZ
@given(body=st.dictionaries(st.sampled_from(["model", "prompt", "max_tokens", "echo", "suffix", "best_of", "n",
                                             "logprobs", "stream", "temperature"]), json_values))
def test_fuzzed_completion_bodies(http: httpx.Client, upstream: FakeUpstream, body: dict[str, Any]) -> None:
    check(http.post("/v1/completions", content=json.dumps({"model": "echo"} | body, allow_nan=True)))


@FUZZ
@given(body=raw_bodies)
def test_fuzzed_raw_bytes(http: httpx.Client, upstream: FakeUpstream, body: bytes) -> None:
    check(http.post("/v1/chat/completions", content=body))
