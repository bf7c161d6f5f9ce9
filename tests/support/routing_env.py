"""Two loopback upstreams (``a`` and ``b``) behind a real gateway, for routing tests: a module
declares its model groups with ``dep`` and ``group`` and serves them with ``routing_gateway``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.contracts import Principal, UsageRecord
from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

NO_BREAKER = {"failures": 1_000_000}


def dep(name: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "provider": "openai", "model": "m", "api_base": url,
            "timeouts": {"connect": 1, "first_byte": 2, "total": 5}} | extra


def group(name: str, *deployments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A model tried in order (``priority``), two retries 10 ms apart, no circuit breaking."""
    return {"name": name, "strategy": "priority", "deployments": list(deployments), "max_retries": 2,
            "retry_backoff": 0.01, "circuit": NO_BREAKER} | extra


@dataclass
class Env:
    server: ServerThread
    usage: RecordingSink
    a: FakeUpstream
    b: FakeUpstream

    def reset(self) -> Env:
        """Each test's start: no faults queued, nothing received, no usage rows."""
        self.a.reset()
        self.b.reset()
        self.usage.records.clear()
        return self

    def counts(self) -> tuple[int, int]:
        """The requests each upstream received."""
        return len(self.a.received), len(self.b.received)

    def only_row(self) -> UsageRecord:
        """The one usage row of the one request the test sent."""
        [row] = self.usage.wait_for(1)
        time.sleep(0.05)
        assert len(self.usage.records) == 1
        return row

    def state(self, deployment: str) -> str:
        """The deployment's state in the admin API's listing (``closed``, ``open``, ``held``, ...)."""
        rows = httpx.get(self.server.url + "/admin/v1/deployments", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        return next(r["state"] for r in rows.json()["data"] if r["deployment"] == deployment)


@contextmanager
def routing_gateway(models: Callable[[str, str], list[dict[str, Any]]], *, prices: dict[str, Any] | None = None,
                    keys: dict[str, Principal] | None = None) -> Iterator[Env]:
    """A gateway serving ``models(a_url, b_url)`` (and ``prices``) to the admin key and ``keys``."""
    a, b = FakeUpstream().start(), FakeUpstream().start()
    try:
        settings = parse_settings({"auth": {"admin_key": ADMIN_KEY}, "models": models(a.url, b.url),
                                   "prices": prices or {}}, env={})
        usage = RecordingSink()
        principals = {ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True)} | (keys or {})
        with scripted_gateway(settings, principals, usage=usage) as server:
            yield Env(server, usage, a, b)
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def env(gateway: Env) -> Env:
    """The test module's ``gateway`` fixture (a ``routing_gateway``), its upstreams reset."""
    return gateway.reset()


@pytest.fixture
def client(env: Env) -> openai.OpenAI:
    """An SDK client of ``env`` without retries of its own (the gateway's are under test)."""
    return openai.OpenAI(base_url=env.server.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
