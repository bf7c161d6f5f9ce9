"""The spend of a background response (``background: true``) is metered once, when it ends, with
the upstream's usage and price, and counted against the budgets: found ended by a poll (twice, or
at once), by a cancel, or by the gateway's follower when nobody polls it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.db import Database
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import db, plain_url  # noqa: F401
from tests.gateway.test_responses_store import Gateway
from tests.gateway.test_tenant_e2e import wait_for_rows
from tests.support.fake_responses import USAGE, FakeResponsesUpstream
from tests.support.servers import ServerThread

PRICE = 100.0  # USD per million tokens, input and output: USAGE's 10 tokens cost 0.001


@pytest.fixture(scope="module")
def native() -> Iterator[FakeResponsesUpstream]:
    server = FakeResponsesUpstream().start()
    yield server
    server.stop()


def _gateway(db: Database, native: FakeResponsesUpstream, journal: str, poll_seconds: float,
             others: dict[str, str]) -> ServerThread:
    """Model ``native`` served by ``native``, and each of ``others`` (name: the api_base of another)."""
    upstreams = {"native": native.url} | others
    models = [{"name": name, "deployments": [{"provider": "openai", "model": "up-model", "api_base": url,
                                              "api_key": "sk-up", "responses_api": True, "name": f"{name}-dep"}]}
              for name, url in upstreams.items()]
    price = {"input_per_million": PRICE, "output_per_million": PRICE}
    settings = gateway_settings(native.url, auth={"admin_key": ADMIN_KEY}, database={"url": plain_url(db)},
                                models=models, prices={name: price for name in upstreams})
    settings.usage.journal_dir = journal
    settings.usage.background_poll_seconds = poll_seconds
    return ServerThread(create_app(settings))


@contextmanager
def _served(db: Database, native: FakeResponsesUpstream, journal: str, poll_seconds: float,
            others: dict[str, str] | None = None) -> Iterator[Gateway]:
    with (
        _gateway(db, native, journal, poll_seconds, others or {}) as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin,
    ):
        yield Gateway(server.url, admin)


@pytest.fixture(scope="module", params=[3600.0, 0.2], ids=["polled", "followed"])
def gateway(request: pytest.FixtureRequest, db: Database, native: FakeResponsesUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with _served(db, native, str(tmp_path_factory.mktemp("journal")), request.param) as served:
        yield served


@pytest.fixture(scope="module")
def followed(db: Database, native: FakeResponsesUpstream,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose follower passes every 0.2 s."""
    with _served(db, native, str(tmp_path_factory.mktemp("journal")), 0.2) as served:
        yield served


def _metered(db: Database, tenant: str, rows: int = 2) -> list[UsageRow]:
    """The tenant's usage rows, once ``rows`` are there and a moment later no more came."""
    found = wait_for_rows(db, tenant, rows)
    time.sleep(0.6)  # longer than the follower's passes: a second metering would be there by now
    again = wait_for_rows(db, tenant, rows)
    assert len(again) == len(found) == rows
    return sorted(again, key=lambda row: row.prompt_tokens + row.completion_tokens)


def _started(gateway: Gateway) -> tuple[str, openai.OpenAI, str]:
    """A tenant whose token budget (145 in all; such a request reserves 140) one background
    response's USAGE (10) leaves too little of, and the id of one it started."""
    tenant, client = gateway.tenant()
    gateway.admin.patch(f"/admin/v1/tenants/{tenant}/limits",
                        json={"token_budget": 145, "budget_period": "total"}).raise_for_status()
    queued = client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
    assert queued.status == "queued"
    return tenant, client, queued.id


def _assert_spent(client: openai.OpenAI, started: UsageRow, ended: UsageRow, status: str) -> None:
    assert (started.prompt_tokens, started.completion_tokens, started.cost) == (0, 0, 0)
    assert (ended.prompt_tokens, ended.completion_tokens, ended.cached_tokens) == (
        USAGE["input_tokens"], USAGE["output_tokens"], 2)
    assert ended.exact and ended.cost == pytest.approx(10 * PRICE / 1e6) and ended.endpoint == "responses"
    assert ended.model == "native" and (ended.error_type is None) == (status == "completed")
    with pytest.raises(openai.RateLimitError) as refused:  # 10 of the 145 tokens spent: the next (140) does not fit
        client.responses.create(model="native", input="work", background=True, max_output_tokens=2)
    assert "token budget" in refused.value.message


def test_a_polled_completion_is_metered_once_with_the_upstreams_usage(
        gateway: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(gateway)
    native.finish(response_id)
    with ThreadPoolExecutor(4) as pool:  # found ended by several polls at once, then again
        statuses = list(pool.map(lambda _: client.responses.retrieve(response_id).status, range(4)))
    assert statuses == ["completed"] * 4 and client.responses.retrieve(response_id).status == "completed"
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "completed")


def test_a_cancelled_one_is_metered_with_what_it_spent(
        gateway: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(gateway)
    native.held[response_id] |= {"usage": USAGE}  # what it spent before the cancel
    assert client.responses.cancel(response_id).status == "cancelled"
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "cancelled")


def test_an_unpolled_one_is_metered_by_the_follower(
        followed: Gateway, db: Database, native: FakeResponsesUpstream) -> None:
    tenant, client, response_id = _started(followed)
    native.finish(response_id)  # nobody asks
    started, ended = _metered(db, tenant)
    _assert_spent(client, started, ended, "completed")
    stored = client.responses.retrieve(response_id)  # stored finished by the follower: the upstream not asked
    assert stored.status == "completed"
