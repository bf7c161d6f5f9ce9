"""Shared fixtures: free ports, the fake upstream, and gateways started on loopback."""

from __future__ import annotations

import os

# Triton kernels run in its interpreter on the CPU for the whole suite. Triton decides this when a
# kernel is decorated, so it is set here, before any test module can import engine code.
os.environ["TRITON_INTERPRET"] = "1"

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.settings import Settings, parse_settings
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread, free_port

ADMIN_KEY = "sk-test-admin"


@pytest.fixture(autouse=True)
def _log_handlers() -> Iterator[None]:
    """Log handlers a test installed on the root and ``switchyard`` loggers are removed after it
    (pytest's own excepted): a command run in-process (typer's CliRunner) may install one on its
    captured stderr (ours, or Litestar's logging config as an app is made), closed when it returns,
    and a later command's warning would go there ("--- Logging error ---" in its own stderr)."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("switchyard")]
    before = [set(log.handlers) for log in loggers]
    yield
    for log, had in zip(loggers, before, strict=True):
        for handler in list(log.handlers):
            if handler not in had and not type(handler).__module__.startswith("_pytest"):
                log.removeHandler(handler)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[FakeUpstream]:
    upstream = FakeUpstream().start()
    yield upstream
    upstream.stop()


@pytest.fixture
def upstream(fake_upstream_server: FakeUpstream) -> FakeUpstream:
    """The session's fake upstream, reset to its default behaviour for this test."""
    fake_upstream_server.reset()
    return fake_upstream_server


def gateway_settings(upstream_url: str, **overrides: Any) -> Settings:
    """Settings with one model ``echo`` (alias ``echo-alias``) served by ``upstream_url``."""
    raw: dict[str, Any] = {
        "auth": {"admin_key": ADMIN_KEY},
        "models": [{
            "name": "echo",
            "aliases": ["echo-alias"],
            "deployments": [{"provider": "openai", "model": "upstream-echo", "api_base": upstream_url,
                             "api_key": "sk-upstream", "timeouts": {"connect": 2, "first_byte": 5, "total": 10}}],
        }],
    }
    raw.update(overrides)
    return parse_settings(raw, env={})


@pytest.fixture
def start_gateway() -> Iterator[Callable[..., ServerThread]]:
    """``start_gateway(settings, services=None)`` -> a running gateway, stopped after the test."""
    from gateway.app import create_app

    started: list[ServerThread] = []

    def start(settings: Settings, services: Any = None) -> ServerThread:
        server = ServerThread(create_app(settings, services)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
