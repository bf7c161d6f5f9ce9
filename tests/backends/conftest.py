"""Fixtures shared by the backend tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_anthropic import FakeAnthropic


@pytest.fixture(scope="module")
def anthropic_upstream() -> Iterator[FakeAnthropic]:
    """A fake Anthropic Messages API on loopback, one per test module."""
    server = FakeAnthropic().start()
    yield server
    server.stop()
