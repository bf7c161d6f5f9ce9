"""Fixtures shared by the backend tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread


@pytest.fixture(scope="module")
def anthropic_upstream() -> Iterator[FakeAnthropic]:
    """A fake Anthropic Messages API on loopback, one per test module."""
    server = FakeAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def claude_gateway_url(anthropic_upstream: FakeAnthropic) -> Iterator[str]:
    """A gateway serving the model ``claude`` from the module's fake Anthropic upstream, to the admin key."""
    deployment = {"provider": "anthropic", "model": "claude-test", "api_base": anthropic_upstream.url,
                  "api_key": "sk"}
    with admin_gateway([{"name": "claude", "max_retries": 0, "deployments": [deployment]}]) as server:
        yield server.url


@pytest.fixture
def claude_client(claude_gateway_url: str, anthropic_upstream: FakeAnthropic) -> openai.OpenAI:
    """The openai SDK on ``claude_gateway_url``, the upstream's record of requests cleared."""
    anthropic_upstream.received.clear()
    return openai.OpenAI(base_url=claude_gateway_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


@contextmanager
def admin_gateway(models: list[dict[str, Any]], prices: dict[str, Any] | None = None,
                  usage: RecordingSink | None = None) -> Iterator[ServerThread]:
    """A gateway on loopback serving ``models`` (config entries, and ``prices``) to the admin key, with
    scripted admission and usage recorded in memory (in ``usage`` when given)."""
    with scripted_gateway(parse_settings({"models": models, "prices": prices or {}}, env={}), usage=usage) as server:
        yield server


def three_providers(chat_url: str, responses_url: str, messages_url: str,
                    **pair: Any) -> list[dict[str, Any]]:
    """Models ``gpt`` (chat upstream), ``native`` (a Responses upstream), ``claude`` (Anthropic) and
    ``pair`` (two deployments ``one`` and ``two`` of the chat upstream; ``pair``: its group's options)."""
    return [
        {"name": "gpt", "deployments": [{"provider": "openai", "model": "up", "api_base": chat_url}]},
        {"name": "native", "deployments": [{"provider": "openai", "model": "up", "api_base": responses_url,
                                            "responses_api": True}]},
        {"name": "claude", "deployments": [{"provider": "anthropic", "model": "claude-test",
                                            "api_base": messages_url, "api_key": "sk"}]},
        {"name": "pair", **pair, "deployments": [{"provider": "openai", "model": "up", "api_base": chat_url,
                                                  "name": name} for name in ("one", "two")]},
    ]


def sse_events(url: str, body: dict[str, Any], headers: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """POST ``body`` to ``url`` and read its event stream (Anthropic's shape): (event, data) pairs."""
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=20) as r:
        assert r.status_code == 200, r.read()
        kind = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    return events
