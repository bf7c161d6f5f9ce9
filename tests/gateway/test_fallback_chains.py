"""Fallbacks chain, across real loopback upstreams: a fallback group that fails goes on to its own
fallbacks (depth-first: a fallback is served as a request for it would be, then the next fallback
of the group before it), never entering a group twice, so a cycle ends with the last failure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.contracts import Principal
from tests.support.fake_upstream import Fault
from tests.support.routing_env import Env, client, dep, env, group, routing_gateway  # noqa: F401  (fixtures)

MESSAGES: Any = [{"role": "user", "content": "route me"}]
DOWN = Fault(status=503)
TOO_LONG = Fault(status=400, body={"error": {"message": "maximum context length exceeded",
                                             "code": "context_length_exceeded"}})
ONLY_FIRST = "sk-only-first"  # a key whose allow-list names the first group of the chain alone


def _models(a: str, b: str) -> list[dict[str, Any]]:
    once = {"max_retries": 0}
    return [
        group("first", dep("first-a", a), fallbacks=["second", "last"], **once),
        group("second", dep("second-a", a), fallbacks=["third"], **once),
        group("third", dep("third-a", a), fallbacks=["first"], **once),  # back to the start: not entered again
        group("last", dep("last-b", b), **once),
        group("ping", dep("ping-a", a), fallbacks=["pong"], **once),
        group("pong", dep("pong-a", a), fallbacks=["ping"], **once),
        group("wide", dep("wide-a", a), context_window_fallbacks=["wider"], **once),
        group("wider", dep("wider-a", a), context_window_fallbacks=["widest"], **once),
        group("widest", dep("widest-b", b), **once),
    ]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    keys = {ONLY_FIRST: Principal(key_id="key-only-first", tenant_id="t1", allowed_models=frozenset({"first"}))}
    prices = {"third": {"input_per_million": 1_000_000.0, "output_per_million": 0.0}}
    with routing_gateway(_models, prices=prices, keys=keys) as env:
        yield env


def test_a_failing_fallback_goes_on_to_its_own_fallbacks(env: Env, client: openai.OpenAI) -> None:
    """first -> second -> third: the fallback's own fallback answers before first's next one (last)."""
    env.a.fail_next(DOWN, DOWN)
    reply = client.chat.completions.create(model="first", messages=MESSAGES)
    assert reply.choices[0].message.content == "route me" and reply.model == "first"
    assert env.counts() == (3, 0)
    row = env.only_row()
    assert (row.status, row.model, row.deployment) == (200, "first", "third-a")
    assert row.cost == pytest.approx(row.prompt_tokens)  # priced as the group that answered


def test_a_spent_chain_returns_to_the_next_fallback_of_the_group_before(env: Env, client: openai.OpenAI) -> None:
    """third's fallback is first, entered already: the chain ends and first's next fallback answers."""
    env.a.fail_next(DOWN, DOWN, DOWN)
    assert client.chat.completions.create(model="first", messages=MESSAGES).model == "first"
    assert env.counts() == (3, 1)
    assert env.only_row().deployment == "last-b"


def test_a_chained_fallback_serves_a_key_allowed_only_the_model_asked_for(env: Env) -> None:
    """As a direct fallback does: the allow-list is checked against the model the client names."""
    env.a.fail_next(DOWN, DOWN)
    client = openai.OpenAI(base_url=env.server.url + "/v1", api_key=ONLY_FIRST, max_retries=0)
    assert client.chat.completions.create(model="first", messages=MESSAGES).choices
    assert env.only_row().deployment == "third-a"


def test_a_stream_follows_the_chain_before_its_first_byte(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(DOWN, DOWN)
    chunks = list(client.chat.completions.create(model="first", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "route me"
    assert env.counts() == (3, 0)
    assert env.only_row().deployment == "third-a"


@pytest.mark.parametrize("stream", [False, True])
def test_a_cycle_of_failing_groups_ends_with_the_last_failure(env: Env, client: openai.OpenAI, stream: bool) -> None:
    env.a.fail_next(DOWN, DOWN, DOWN)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="ping", messages=MESSAGES, stream=stream)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert env.counts() == (2, 0)  # ping, pong, and not ping again
    row = env.only_row()
    assert (row.status, row.model, row.deployment) == (503, "ping", "pong-a")


def test_context_window_fallbacks_chain_too(env: Env, client: openai.OpenAI) -> None:
    env.a.fail_next(TOO_LONG, TOO_LONG)
    assert client.chat.completions.create(model="wide", messages=MESSAGES).choices
    assert env.counts() == (2, 1)
    assert env.only_row().deployment == "widest-b"
