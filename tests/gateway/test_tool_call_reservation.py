"""A request that enables a tool the provider runs and bills per call (``per_tool_call``) reserves its
price for a bounded number of calls at admission, so a money budget without room for them refuses
it before the upstream is called; settlement charges the calls the answer reports. The real app on
Redis and SQLite/PostgreSQL, the openai and anthropic SDKs as clients, loopback upstreams serving
the Responses API (``responses_api: true``) and the Messages API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.db import Database
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import REDIS_URL, db, plain_url  # noqa: F401
from tests.gateway.test_tenant_e2e import wait_for_rows
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_responses import SEARCH, FakeResponsesUpstream
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

# tokens at 1 USD a million (a request's reservation for them is well under 0.005 USD), a search at 0.01
PRICE = {"input_per_million": 1.0, "output_per_million": 1.0, "per_tool_call": {"web_search": 0.01}}
TOKENS = (7 + 3) / 1e6  # the fake Responses upstream's usage: 7 prompt tokens, 3 output


@dataclass
class Gateway:
    url: str
    admin: httpx.Client
    responses: FakeResponsesUpstream
    messages: FakeAnthropic

    def tenant(self, budget: float) -> tuple[str, str]:
        """A tenant with a money budget of ``budget`` USD in all, and a key of its."""
        r = self.admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
        tenant = r.json()["id"]
        self.admin.patch(f"/admin/v1/tenants/{tenant}/limits",
                         json={"cost_budget": budget, "budget_period": "total"}).raise_for_status()
        return tenant, self.admin.post("/admin/v1/keys", json={"tenant_id": tenant}).json()["key"]

    def openai(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def gateway(db: Database, fake_upstream_server: FakeUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    responses, messages = FakeResponsesUpstream().start(), FakeAnthropic().start()
    native = {"provider": "openai", "model": "up-model", "api_base": responses.url, "api_key": "sk-up",
              "responses_api": True}
    claude = {"provider": "anthropic", "model": "claude-test", "api_base": messages.url, "api_key": "sk-up",
              "server_tools": ["web_search_20250305"]}
    settings = gateway_settings(fake_upstream_server.url, auth={"admin_key": ADMIN_KEY},
                                database={"url": plain_url(db)}, redis={"url": REDIS_URL},
                                models=[{"name": "searcher", "max_retries": 0, "deployments": [native]},
                                        {"name": "claude", "max_retries": 0, "deployments": [claude]}],
                                prices={"searcher": PRICE, "claude": PRICE})
    settings.usage.journal_dir = str(tmp_path_factory.mktemp("journal"))
    try:
        with (
            ServerThread(create_app(settings)) as server,
            httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20) as admin,
        ):
            yield Gateway(server.url, admin, responses, messages)
    finally:
        responses.stop()
        messages.stop()


@pytest.mark.parametrize("tool", ["web_search", "web_search_preview"])
def test_a_budget_without_room_for_a_search_refuses_a_request_enabling_it_before_the_upstream(
        gateway: Gateway, db: Database, tool: str) -> None:
    tenant, key = gateway.tenant(budget=0.005)  # the tokens fit; one search (0.01) does not
    client = gateway.openai(key)
    sent = len(gateway.responses.received)
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(model="searcher", input="hello", tools=[{"type": tool}])  # type: ignore[list-item]
    assert "spending budget" in refused.value.message and "priced tools" in refused.value.message
    assert len(gateway.responses.received) == sent  # refused before the upstream was called
    client.responses.create(model="searcher", input="hello")  # without the tool: tokens only, admitted
    rows = wait_for_rows(db, tenant, 2)
    assert sorted(row.cost for row in rows) == [0.0, pytest.approx(TOKENS)]


def test_max_tool_calls_bounds_the_reservation_and_the_calls_made_are_settled(gateway: Gateway, db: Database) -> None:
    """The default bound (several searches) does not fit a budget of 0.025; two searches do, and
    the answer's two searches are what is charged; then one more search does not fit."""
    tenant, key = gateway.tenant(budget=0.025)
    client = gateway.openai(key)
    tools: Any = [{"type": "web_search"}]
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="searcher", input=f"{SEARCH} any", tools=tools)
    answer = client.responses.create(model="searcher", input=f"{SEARCH} two", tools=tools, max_tool_calls=2)
    assert [item.type for item in answer.output].count("web_search_call") == 2
    rows = [row for row in wait_for_rows(db, tenant, 2) if row.status == 200]
    assert [row.cost for row in rows] == [pytest.approx(0.02 + TOKENS)]
    with pytest.raises(openai.RateLimitError):  # 0.02001 spent: a search more (0.01) does not fit
        client.responses.create(model="searcher", input=f"{SEARCH} one", tools=tools, max_tool_calls=1)


def test_a_server_tool_reserves_its_max_uses_on_the_messages_api(gateway: Gateway, db: Database) -> None:
    tenant, key = gateway.tenant(budget=0.015)
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    sent = len(gateway.messages.received)
    with pytest.raises(anthropic.RateLimitError):  # two searches reserved: 0.02
        client.messages.create(model="claude", max_tokens=8, messages=messages,
                               tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}])
    assert len(gateway.messages.received) == sent
    answer = client.messages.create(model="claude", max_tokens=8, messages=messages,
                                    tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}])
    assert answer.usage.server_tool_use is not None and answer.usage.server_tool_use.web_search_requests == 1
    ok = [row for row in wait_for_rows(db, tenant, 2) if row.status == 200]
    tokens = (answer.usage.input_tokens + 2 + answer.usage.output_tokens) / 1e6  # 2 read from the cache
    assert [row.cost for row in ok] == [pytest.approx(0.01 + tokens)]
