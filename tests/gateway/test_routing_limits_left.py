"""What successful answers say of their upstream's limits steers the router before any 429.

OpenAI, Azure and Anthropic send their rate-limit headers with every answer. When one says fewer
tokens are left than a request needs, the group's other deployments take such requests until the
limit resets, while smaller ones still go there; the next answer saying plenty are left ends it.
Real upstreams on loopback (OpenAI-compatible and Anthropic), the openai SDK as the client.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

MESSAGES: Any = [{"role": "user", "content": "route me"}]
SMALL, LARGE = 10, 1000  # max_tokens: a request that fits in 100 tokens, and one that does not
LOW = {"x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-requests": "499",
       "x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "6m0s"}
PLENTY = LOW | {"x-ratelimit-remaining-tokens": "29000"}
NO_REQUESTS = PLENTY | {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m0s"}


def _dep(name: str, url: str, provider: str = "openai") -> dict[str, Any]:
    return {"name": name, "provider": provider, "model": "m", "api_base": url, "api_key": "sk-up",
            "timeouts": {"connect": 1, "first_byte": 2, "total": 5}}


def _group(name: str, *deployments: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "strategy": "priority", "deployments": list(deployments), "max_retries": 1,
            "retry_backoff": 0.01}


@dataclass
class Env:
    server: ServerThread
    a: FakeUpstream
    b: FakeUpstream
    claude: FakeAnthropic

    def counts(self, first: FakeUpstream | FakeAnthropic | None = None) -> tuple[int, int]:
        """Requests received by the group's first deployment (``a`` unless named) and by ``b``."""
        return len((first or self.a).received), len(self.b.received)


@pytest.fixture(scope="module")
def gateway() -> Iterator[Env]:
    a, b, claude = FakeUpstream().start(), FakeUpstream().start(), FakeAnthropic().start()
    models = [  # each test its own group: what a deployment's health learnt lasts
        *(_group(f"steer-{kind}", _dep(f"{kind}-a", a.url), _dep(f"{kind}-b", b.url)) for kind in ("unary", "stream")),
        _group("spent", _dep("spent-a", a.url), _dep("spent-b", b.url)),
        _group("spent-lone", _dep("lone-a", a.url)),
        *(_group(f"claude-{kind}", _dep(f"claude-{kind}-a", claude.url, "anthropic"), _dep(f"claude-{kind}-b", b.url))
          for kind in ("unary", "stream")),
    ]
    settings = parse_settings({"auth": {"admin_key": ADMIN_KEY}, "models": models}, env={})
    with scripted_gateway(settings) as server:
        yield Env(server, a, b, claude)
    for upstream in (a, b, claude):
        upstream.stop()


@pytest.fixture
def env(gateway: Env) -> Env:
    gateway.a.reset()
    gateway.b.reset()
    gateway.claude.received.clear()
    gateway.claude.answer_headers = {}
    return gateway


@pytest.fixture
def client(env: Env) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def _ask(client: openai.OpenAI, model: str, max_tokens: int, stream: bool = False) -> None:
    """One chat completion (a stream read to its end), which must succeed."""
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens,
                                                      stream=True))
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
    else:
        assert client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens).choices


def _state(env: Env, deployment: str) -> str:
    rows = httpx.get(env.server.url + "/admin/v1/deployments", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    return next(r["state"] for r in rows.json()["data"] if r["deployment"] == deployment)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_an_answer_short_of_tokens_sends_larger_requests_elsewhere(env: Env, client: openai.OpenAI,
                                                                   stream: bool) -> None:
    """Its answer said 100 tokens are left: a request reserving more goes to the other deployment,
    a small one is still sent there (it is not held off), and its answer saying plenty ends it."""
    group = f"steer-{'stream' if stream else 'unary'}"
    env.a.answer_headers = LOW
    _ask(client, group, SMALL, stream)
    assert env.counts() == (1, 0)
    _ask(client, group, LARGE, stream)
    assert env.counts() == (1, 1)  # not sent where the upstream would refuse it
    env.a.answer_headers = PLENTY
    _ask(client, group, SMALL, stream)
    assert env.counts() == (2, 1) and _state(env, f"{group.removeprefix('steer-')}-a") == "healthy"
    _ask(client, group, LARGE, stream)
    assert env.counts() == (3, 1)  # the last answer said plenty are left


def test_an_answer_with_no_request_left_sends_every_request_elsewhere(env: Env, client: openai.OpenAI) -> None:
    """No request left until the requests reset: even a small one goes to the other deployment;
    where there is none, it is sent there all the same (the deployment is not held off)."""
    env.a.answer_headers = NO_REQUESTS
    _ask(client, "spent", SMALL)
    _ask(client, "spent", SMALL)
    assert env.counts() == (1, 1)
    _ask(client, "spent-lone", SMALL)
    _ask(client, "spent-lone", SMALL)
    assert env.counts() == (3, 1) and _state(env, "lone-a") == "healthy"


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_anthropics_answer_short_of_tokens_holds_until_its_reset_time(env: Env, client: openai.OpenAI,
                                                                      stream: bool) -> None:
    """Anthropic's headers, with the reset as an RFC 3339 time: larger requests go elsewhere until then."""
    group = f"claude-{'stream' if stream else 'unary'}"
    reset = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    env.claude.answer_headers = {"anthropic-ratelimit-requests-remaining": "49",
                                 "anthropic-ratelimit-tokens-remaining": "100",
                                 "anthropic-ratelimit-tokens-reset": reset.isoformat().replace("+00:00", "Z")}
    _ask(client, group, SMALL, stream)
    _ask(client, group, LARGE, stream)
    assert env.counts(env.claude) == (1, 1)
    time.sleep(max(0.0, reset.timestamp() - time.time()) + 0.1)
    env.claude.answer_headers = {}
    _ask(client, group, LARGE, stream)
    assert env.counts(env.claude) == (2, 1)  # its limit has reset
