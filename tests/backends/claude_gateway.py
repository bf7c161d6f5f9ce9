"""A gateway with one Claude model ("claude") in front of a loopback server speaking the Messages API
(``ScriptedAnthropic``), and an openai SDK client of it: the fixtures of the chat -> Messages
translation tests, imported by name where they are used."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.backends.conftest import admin_gateway
from tests.conftest import ADMIN_KEY
from tests.support.fake_anthropic import ScriptedAnthropic


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedAnthropic]:
    server = ScriptedAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway_url(upstream: ScriptedAnthropic) -> Iterator[str]:
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": upstream.url, "api_key": "sk"}
    with admin_gateway([{"name": "claude", "max_retries": 0, "deployments": [deployment]}]) as server:
        yield server.url


@pytest.fixture
def client(gateway_url: str, upstream: ScriptedAnthropic) -> openai.OpenAI:
    """An openai SDK client of the gateway, the upstream's script, faults and records reset."""
    upstream.received.clear()
    upstream.faults.clear()
    upstream.answer_headers = {}
    upstream.script = None
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=ADMIN_KEY, max_retries=0)
