"""Fixtures shared by the backend tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from backends.factory import build_backend
from gateway.app import create_app
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.servers import ServerThread


@pytest.fixture(scope="module")
def anthropic_upstream() -> Iterator[FakeAnthropic]:
    """A fake Anthropic Messages API on loopback, one per test module."""
    server = FakeAnthropic().start()
    yield server
    server.stop()


@contextmanager
def admin_gateway(models: list[dict[str, Any]]) -> Iterator[ServerThread]:
    """A gateway on loopback serving ``models`` (config entries) to the admin key, with scripted
    admission and usage recorded in memory."""
    settings = parse_settings({"models": models}, env={})
    services = Services(authenticator=StaticKeys({ADMIN_KEY: Principal("admin", None, is_admin=True)}),
                        admission=ScriptedAdmission(), usage=RecordingSink(),
                        router=Router.from_settings(settings, build_backend))
    with ServerThread(create_app(settings, services)) as server:
        yield server
