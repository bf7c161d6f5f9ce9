"""Tenancy under concurrency and rotation, on SQLite and PostgreSQL: concurrent limit updates lose
nothing and never collide, a rotated key continues its predecessor's budget (in the quota store and
when the budget is rebuilt from the usage records), and names are validated in the service."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar

from gateway.admin.api import admin_routers
from gateway.admin.service import AdminError, TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.contracts import Principal, UsageRecord
from gateway.db import Database
from gateway.quotas.limits import Limits, LimitsSource, Scope
from gateway.quotas.recorded import Recorded, recorded_spend
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import REDIS_URL, LoopbackServer, db, plain_url  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
FIELDS = ["requests_per_minute", "tokens_per_minute", "max_concurrency", "token_budget"]


@pytest.fixture(scope="module")
async def api(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    auth = SqlAuthenticator(db, ttl=0.5, admin_key=ADMIN_KEY)
    svc = TenancyService(db, on_change=auth.invalidate)
    app = Litestar(route_handlers=admin_routers(svc, db, auth))
    async with LoopbackServer(app) as url, httpx.AsyncClient(base_url=url, timeout=30, headers=ADMIN) as client:
        yield client


async def _tenant(api: httpx.AsyncClient) -> str:
    r = await api.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


# ---------------------------------------------------------------- concurrent limit updates


async def test_concurrent_patches_of_different_fields_all_stick(api: httpx.AsyncClient) -> None:
    tid = await _tenant(api)
    for trial in range(8):
        assert (await api.put(f"/admin/v1/tenants/{tid}/limits", json={})).status_code == 200
        rs = await asyncio.gather(*[api.patch(f"/admin/v1/tenants/{tid}/limits", json={f: 100 + trial})
                                    for f in FIELDS])
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        final = (await api.get(f"/admin/v1/tenants/{tid}/limits")).json()
        assert {f: final[f] for f in FIELDS} == dict.fromkeys(FIELDS, 100 + trial), (trial, final)


async def test_concurrent_first_writes_of_a_scopes_limits_never_collide(api: httpx.AsyncClient) -> None:
    tid = await _tenant(api)
    rs = await asyncio.gather(*[api.patch(f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": 10 + i})
                                for i in range(10)])
    assert [r.status_code for r in rs] == [200] * 10, [r.text for r in rs if r.status_code != 200]
    final = (await api.get(f"/admin/v1/tenants/{tid}/limits")).json()["requests_per_minute"]
    assert final in {10 + i for i in range(10)}
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tid})).json()["id"]
    rs = await asyncio.gather(*[api.put(f"/admin/v1/keys/{key}/limits", json={"max_concurrency": 1 + i})
                                for i in range(10)])
    assert [r.status_code for r in rs] == [200] * 10, [r.text for r in rs if r.status_code != 200]
    assert [r.json()["max_concurrency"] for r in rs] == [1 + i for i in range(10)]  # each answer is its own write


async def test_patch_keeps_the_other_fields_and_an_empty_patch_changes_nothing(api: httpx.AsyncClient) -> None:
    tid = await _tenant(api)
    r = await api.put(f"/admin/v1/tenants/{tid}/limits", json={"cost_budget": 5.0, "budget_period": "day"})
    assert r.status_code == 200
    r = await api.patch(f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": 3})
    assert r.json() == {"requests_per_minute": 3, "tokens_per_minute": None, "max_concurrency": None,
                        "token_budget": None, "cost_budget": 5.0, "budget_period": "day"}
    assert (await api.patch(f"/admin/v1/tenants/{tid}/limits", json={})).json() == r.json()
    fresh = await _tenant(api)
    assert (await api.patch(f"/admin/v1/tenants/{fresh}/limits", json={})).json()["budget_period"] == "month"
    r = await api.patch(f"/admin/v1/tenants/{fresh}/limits", json={"token_budget": 9})
    assert r.json()["budget_period"] == "month" and r.json()["token_budget"] == 9


# ---------------------------------------------------------------- names


async def test_the_service_validates_names(db: Database) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant(f"  named-{uuid.uuid4().hex[:6]}  ")
    assert tenant.name == tenant.name.strip()
    for bad in ("   ", "", "x" * 201):
        with pytest.raises(AdminError) as raised:
            await svc.update_tenant(tenant.id, name=bad)
        assert raised.value.param == "name"
    assert (await svc.get_tenant(tenant.id)).name == tenant.name
    with pytest.raises(AdminError) as raised:
        await svc.create_key(tenant.id, name="k" * 300)
    assert raised.value.param == "name" and "200" in raised.value.message
    assert (await svc.create_key(tenant.id, name="k" * 200)).key.name == "k" * 200


# ---------------------------------------------------------------- rotation keeps the budget


def _usage(key_id: str, tenant_id: str, tokens: int) -> UsageRecord:
    return UsageRecord(request_id=uuid.uuid4().hex, key_id=key_id, tenant_id=tenant_id, model="echo",
                       deployment="d", provider="openai", endpoint="chat.completions", started_at=time.time(),
                       status=200, prompt_tokens=tokens, completion_tokens=0, cost=tokens * 1e-6)


async def test_a_rotated_key_is_counted_with_its_whole_chain(db: Database, tmp_path: Path) -> None:
    svc = TenancyService(db)
    tenant = await svc.create_tenant(f"chain-{uuid.uuid4().hex[:6]}")
    first = (await svc.create_key(tenant.id)).key.id
    await svc.set_limits("key", first, Limits(token_budget=1000, budget_period="total"))
    second = (await svc.rotate_key(first)).key.id
    third = (await svc.rotate_key(second)).key.id
    other = (await svc.create_key(tenant.id)).key.id  # a separate key of the same tenant
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path)
    for key, tokens in ((first, 100), (second, 20), (third, 3), (other, 5000)):
        writer.record(_usage(key, tenant.id, tokens))
    await writer.flush()

    limits = LimitsSource(db, ttl=0)
    scopes = {key: (await limits.scopes(Principal(key_id=key, tenant_id=tenant.id)))[0]
              for key in (first, second, third, other)}
    assert scopes[first].id == scopes[second].id == scopes[third].id == first  # one set of counters
    assert scopes[third].limits.token_budget == 1000  # each key keeps its own (copied) limits
    assert scopes[other].id == other
    for key in (first, second, third):
        assert await recorded_spend(db, scopes[key], time.time()) == Recorded(123, 123 * 10**6, [])  # pico-dollars
    assert await recorded_spend(db, scopes[other], time.time()) == Recorded(5000, 5000 * 10**6, [])
    assert await recorded_spend(db, Scope("tenant", tenant.id, Limits()), time.time()) == Recorded(
        5123, 5123 * 10**6, [])


def _chat(server: ServerThread, key: str) -> int:
    body = {"model": "echo", "max_tokens": 5, "messages": [{"role": "user", "content": "one two three four five"}]}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=20,
                      headers={"authorization": f"Bearer {key}"}).status_code


@pytest.fixture
def settings_for(db: Database, fake_upstream_server: FakeUpstream,
                 tmp_path: Path) -> Iterator[Any]:
    def make(**overrides: Any) -> Any:
        return gateway_settings(fake_upstream_server.url, database={"url": plain_url(db)},
                                usage={"journal_dir": str(tmp_path / "journal")}, **overrides)

    yield make


def test_rotation_does_not_reset_a_keys_budget(settings_for: Any) -> None:
    """The old key spends its token budget; the key rotated from it (and the old key in its grace
    period) is refused at once: in Redis, and in a gateway that rebuilds the budget from SQL."""
    from gateway.app import create_app

    with ServerThread(create_app(settings_for(redis={"url": REDIS_URL}))) as server, httpx.Client(
            base_url=server.url, headers=ADMIN, timeout=20) as admin:
        tid = admin.post("/admin/v1/tenants", json={"name": f"rot-{uuid.uuid4().hex[:8]}"}).json()["id"]
        old = admin.post("/admin/v1/keys", json={"tenant_id": tid}).json()
        r = admin.put(f"/admin/v1/keys/{old['id']}/limits", json={"token_budget": 300, "budget_period": "total"})
        assert r.status_code == 200, r.text
        codes = [_chat(server, old["key"]) for _ in range(60)]
        assert 200 in codes and codes[-1] == 429, codes
        new = admin.post(f"/admin/v1/keys/{old['id']}/rotate", json={"grace_seconds": 3600}).json()
        assert _chat(server, new["key"]) == 429
        assert _chat(server, old["key"]) == 429
    # No Redis: the budget bucket is rebuilt from the usage records of the whole chain.
    with ServerThread(create_app(settings_for())) as server:
        assert _chat(server, new["key"]) == 429
