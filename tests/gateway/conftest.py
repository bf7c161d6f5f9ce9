"""A gateway with test keys (admin, model-restricted, throttled) in front of the fake upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.contracts import Principal
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import drop_pg_database, new_pg_database
from tests.support.doubles import RecordingSink, ScriptedAdmission
from tests.support.fake_upstream import FakeUpstream
from tests.support.scripted_gateway import scripted_gateway
from tests.support.servers import ServerThread

ROUTES = ["direct", "litestar"]  # how a request to the busiest routes can be served


@contextmanager
def served_by(env: GatewayEnv, route: str) -> Iterator[str]:
    """``env``'s gateway serving the busiest routes directly (``gateway.fast_routes``, as it does by
    default), or, for ``"litestar"``, through Litestar's routing like every other route."""
    app = env.server.app
    fast = app.fast_routes
    if route == "litestar":
        app.fast_routes = None
    try:
        yield route
    finally:
        app.fast_routes = fast


LIMITED_KEY = "sk-test-limited"  # may use only the model "other"
THROTTLED_KEY = "sk-test-throttled"  # always rate limited


@dataclass
class GatewayEnv:
    server: ServerThread
    admission: ScriptedAdmission
    usage: RecordingSink

    @property
    def base_url(self) -> str:
        return self.server.url + "/v1"


def _settings(upstream_url: str):
    timeouts = {"connect": 2, "first_byte": 5, "total": 10}
    deployment = {"provider": "openai", "model": "upstream-echo", "api_base": upstream_url, "api_key": "sk-up",
                  "timeouts": timeouts}
    # No retries and no circuit breaking here: each test sees exactly one upstream attempt.
    plain = {"max_retries": 0, "circuit": {"failures": 1_000_000}}
    return gateway_settings(upstream_url, models=[
        {"name": "echo", "aliases": ["echo-alias"], "deployments": [deployment], **plain},
        {"name": "other", "deployments": [deployment | {"name": "other-dep"}], **plain},
        {"name": "impatient", "deployments": [deployment | {"name": "impatient-dep",
                                                            "timeouts": timeouts | {"first_byte": 0.5, "total": 1}}],
         **plain},
        {"name": "trimmed", "deployments": [deployment | {"name": "trimmed-dep", "drop_params": ["store"],
                                                          "rename_params": {"max_completion_tokens": "max_tokens"}}],
         **plain},
        {"name": "dead", "deployments": [deployment | {"name": "dead-dep", "api_base": "http://127.0.0.1:9/v1"}],
         **plain},
    ], prices={"echo": {"input_per_million": 1_000_000, "output_per_million": 2_000_000}})


@pytest.fixture(scope="module")
def gateway_env(fake_upstream_server: FakeUpstream) -> Iterator[GatewayEnv]:
    settings = _settings(fake_upstream_server.url)
    admission = ScriptedAdmission(throttled={"throttled": 7.0})
    usage = RecordingSink()
    keys = {
        ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True),
        LIMITED_KEY: Principal(key_id="limited", tenant_id="t1", allowed_models=frozenset({"other"})),
        THROTTLED_KEY: Principal(key_id="throttled", tenant_id="t1"),
    }
    with scripted_gateway(settings, keys, admission=admission, usage=usage) as server:
        yield GatewayEnv(server, admission, usage)


@pytest.fixture
def env(gateway_env: GatewayEnv, upstream: FakeUpstream) -> GatewayEnv:
    gateway_env.usage.records.clear()
    gateway_env.admission.settled.clear()
    return gateway_env


@pytest.fixture(params=["sqlite", "postgresql"])
async def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a new, empty database: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
        return
    name, url = await new_pg_database()
    yield url
    await drop_pg_database(name)
