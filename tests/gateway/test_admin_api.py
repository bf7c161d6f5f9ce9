"""The admin REST API and /v1/usage over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import gzip
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from litestar import Litestar

from gateway.admin.api import admin_routers
from gateway.admin.service import TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.contracts import UsageRecord
from gateway.db import Database, migrate
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.dashboard_fixtures import login
from tests.gateway.tenancy_fixtures import (  # noqa: F401  (fixtures)
    LoopbackServer,
    db,
    drop_pg_database,
    migrated_pg_url,
    new_pg_database,
    pg_admin,
    pg_admin_api,
)
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

ADMIN = "sy-admin-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
async def api(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    auth = SqlAuthenticator(db, ttl=0.5, admin_key=ADMIN)
    svc = TenancyService(db, on_change=auth.invalidate)
    app = Litestar(route_handlers=admin_routers(svc, db, auth))
    async with LoopbackServer(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


def admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN}"}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param


async def new_tenant(api: httpx.AsyncClient) -> dict[str, object]:
    r = await api.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"}, headers=admin())
    assert r.status_code == 201, r.text
    return r.json()


async def test_admin_only(api: httpx.AsyncClient) -> None:
    assert_error(await api.get("/admin/v1/tenants"), 401)
    assert_error(await api.get("/admin/v1/tenants", headers=bearer("sk-sy-" + "x" * 43)), 401)
    tenant = await new_tenant(api)
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tenant["id"]}, headers=admin())).json()["key"]
    r = await api.get("/admin/v1/tenants", headers=bearer(key))
    assert_error(r, 403)
    assert r.json()["error"]["type"] == "permission_error"
    admin_key = (await api.post("/admin/v1/keys", json={"admin": True, "name": "ops"}, headers=admin())).json()
    assert admin_key["is_admin"] and admin_key["tenant_id"] is None
    assert (await api.get("/admin/v1/tenants", headers=bearer(admin_key["key"]))).status_code == 200


async def test_tenant_crud(api: httpx.AsyncClient) -> None:
    tenant = await new_tenant(api)
    tid = tenant["id"]
    assert tenant["status"] == "active" and str(tid).startswith("ten_")
    listing = (await api.get("/admin/v1/tenants", headers=admin())).json()
    assert listing["object"] == "list" and tid in [t["id"] for t in listing["data"]]
    assert (await api.get(f"/admin/v1/tenants/{tenant['name']}", headers=admin())).json()["id"] == tid
    r = await api.patch(f"/admin/v1/tenants/{tid}", json={"weight": 3}, headers=admin())
    assert r.json()["weight"] == 3
    assert (await api.post(f"/admin/v1/tenants/{tid}/disable", headers=admin())).json()["status"] == "disabled"
    assert_error(await api.post("/admin/v1/tenants", json={"name": tenant["name"]}, headers=admin()), 409, "name")
    assert_error(await api.get("/admin/v1/tenants/ten_nope", headers=admin()), 404)


async def test_bad_bodies_are_400_naming_the_field(api: httpx.AsyncClient) -> None:
    h = admin()
    assert_error(await api.post("/admin/v1/tenants", content=b"{nope", headers=h), 400)
    assert_error(await api.post("/admin/v1/tenants", json={"name": ""}, headers=h), 400, "name")
    assert_error(await api.post("/admin/v1/tenants", json={"name": "x", "colour": 1}, headers=h), 400, "colour")
    tid = (await new_tenant(api))["id"]
    r = await api.put(f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": -1}, headers=h)
    assert_error(r, 400, "requests_per_minute")
    r = await api.put(f"/admin/v1/tenants/{tid}/limits", json={"budget_period": "week"}, headers=h)
    assert_error(r, 400, "budget_period")
    assert_error(await api.post("/admin/v1/keys", json={}, headers=h), 400, "tenant_id")
    assert_error(await api.post("/admin/v1/keys", json={"tenant_id": "ten_nope"}, headers=h), 404, "tenant_id")
    assert_error(await api.get("/admin/v1/keys?tenant_id=ten_nope", headers=h), 404, "tenant_id")
    assert_error(await api.post("/admin/v1/keys/key_nope/rotate", json={}, headers=h), 404)
    assert_error(await api.get("/admin/v1/usage?group_by=colour", headers=h), 400, "group_by")
    assert_error(await api.get("/admin/v1/usage?group_by=model&group_by=colour", headers=h), 400, "group_by")
    assert_error(await api.get("/admin/v1/usage?start=yesterday", headers=h), 400, "start")


async def test_a_key_given_two_expiries_is_400_naming_both(api: httpx.AsyncClient) -> None:
    tid = (await new_tenant(api))["id"]
    body = {"tenant_id": tid, "expires_in_seconds": 3600, "expires_at": "2099-01-01T00:00:00Z"}
    r = await api.post("/admin/v1/keys", json=body, headers=admin())
    assert_error(r, 400, "expires_in_seconds")
    assert "expires_at" in r.json()["error"]["message"] and "expires_in_seconds" in r.json()["error"]["message"]
    listed = (await api.get(f"/admin/v1/keys?tenant_id={tid}", headers=admin())).json()
    assert listed["data"] == []  # nothing was created
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "expires_in_seconds": 3600}, headers=admin())
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("seconds", [1e-300, 0.5, 0.999])
async def test_a_key_that_would_expire_before_it_is_usable_is_400(api: httpx.AsyncClient, seconds: float) -> None:
    """``expires_in_seconds: 1e-300`` once made a key that had expired before it was created."""
    tid = (await new_tenant(api))["id"]
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "expires_in_seconds": seconds}, headers=admin())
    assert_error(r, 400, "expires_in_seconds")
    assert "expires_in_seconds" in r.json()["error"]["message"]
    assert (await api.get(f"/admin/v1/keys?tenant_id={tid}", headers=admin())).json()["data"] == []
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "expires_in_seconds": 1}, headers=admin())
    assert r.status_code == 201 and r.json()["expires_at"] > r.json()["created_at"], r.text


async def test_key_lifecycle(api: httpx.AsyncClient) -> None:
    tid = (await new_tenant(api))["id"]
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "name": "ci", "models": ["m1"]}, headers=admin())
    assert r.status_code == 201
    created = r.json()
    secret = created["key"]
    assert secret.startswith("sk-sy-") and len(secret) >= 6 + 43 and created["prefix"] == secret[:12]
    listed = (await api.get(f"/admin/v1/keys?tenant_id={tid}", headers=admin())).json()["data"]
    assert [k["id"] for k in listed] == [created["id"]]
    assert all(secret not in str(k) for k in listed)  # the key is shown once, never listed
    rotated = (
        await api.post(f"/admin/v1/keys/{created['id']}/rotate", json={"grace_seconds": 60}, headers=admin())
    ).json()
    assert rotated["rotated_from"] == created["id"] and rotated["allowed_models"] == ["m1"]
    assert rotated["key"] != secret
    old = (await api.get(f"/admin/v1/keys/{created['id']}", headers=admin())).json()
    assert old["expires_at"] is not None and old["status"] == "active"  # valid during the grace period
    again = await api.post(f"/admin/v1/keys/{rotated['id']}/rotate", headers=admin())  # no body: defaults
    assert again.status_code == 201 and again.json()["rotated_from"] == rotated["id"]
    revoked = (await api.post(f"/admin/v1/keys/{created['id']}/revoke", headers=admin())).json()
    assert revoked["status"] == "revoked"


async def test_limits_put_patch_get(api: httpx.AsyncClient) -> None:
    tid = (await new_tenant(api))["id"]
    h = admin()
    r = await api.put(
        f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": 10, "token_budget": 5000}, headers=h
    )
    assert r.json()["requests_per_minute"] == 10 and r.json()["budget_period"] == "month"
    r = await api.patch(
        f"/admin/v1/tenants/{tid}/limits", json={"tokens_per_minute": 99, "token_budget": None}, headers=h
    )
    assert r.json() == {
        "requests_per_minute": 10, "tokens_per_minute": 99, "max_concurrency": None,
        "token_budget": None, "cost_budget": None, "budget_period": "month",
    }  # fmt: skip
    assert (await api.get(f"/admin/v1/tenants/{tid}/limits", headers=h)).json() == r.json()
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tid}, headers=h)).json()
    r = await api.put(f"/admin/v1/keys/{key['id']}/limits", json={"max_concurrency": 2}, headers=h)
    assert r.json()["max_concurrency"] == 2


async def test_usage_is_tenant_isolated(api: httpx.AsyncClient, db: Database, tmp_path: Path) -> None:
    h = admin()
    a, b = (await new_tenant(api))["id"], (await new_tenant(api))["id"]
    ka = (await api.post("/admin/v1/keys", json={"tenant_id": a}, headers=h)).json()
    kb = (await api.post("/admin/v1/keys", json={"tenant_id": b}, headers=h)).json()
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path)
    for tenant, key, n in ((a, ka["id"], 3), (b, kb["id"], 5)):
        for _ in range(n):
            writer.record(
                UsageRecord(
                    request_id=uuid.uuid4().hex,
                    key_id=key,
                    tenant_id=tenant,
                    model="m",
                    deployment="d",
                    provider="openai",
                    endpoint="chat.completions",
                    started_at=time.time(),
                    status=200,
                    prompt_tokens=7,
                    completion_tokens=3,
                )  # fmt: skip
            )
    await writer.aclose()
    own = (await api.get("/v1/usage?group_by=model", headers=bearer(ka["key"]))).json()["data"]
    assert own == [{"model": "m", "requests": 3, "errors": 0, "prompt_tokens": 21, "completion_tokens": 9,
                    "cached_tokens": 0, "total_tokens": 30, "cost": 0.0}]  # fmt: skip
    # asking for the other tenant's key, or grouping by tenant, still shows only the caller's tenant
    assert (await api.get(f"/v1/usage?key_id={kb['id']}", headers=bearer(ka["key"]))).json()["data"] == []
    by_tenant = (await api.get("/v1/usage?group_by=tenant", headers=bearer(ka["key"]))).json()["data"]
    assert [r["tenant"] for r in by_tenant] == [a]
    # a tenant key cannot reach any admin endpoint about tenant b
    for path in (f"/admin/v1/tenants/{b}", f"/admin/v1/keys?tenant_id={b}", f"/admin/v1/usage?tenant_id={b}"):
        assert_error(await api.get(path, headers=bearer(ka["key"])), 403)
    # the admin sees both
    rows = (await api.get("/admin/v1/usage?group_by=tenant", headers=h)).json()["data"]
    counts = {r["tenant"]: r["requests"] for r in rows}
    assert counts[a] == 3 and counts[b] == 5
    assert_error(await api.get("/v1/usage", headers=h), 403)  # admin keys have no tenant


async def test_usage_cost_is_the_rows_sum_not_rounded_to_eight_decimals(
    api: httpx.AsyncClient, db: Database, tmp_path: Path
) -> None:
    """A cheap model's request costs well under a millionth of a dollar (7.5e-08: one cached token at
    $0.075/M): the report's cost is the rows' sum, as the export shows each row, not 7e-08 or 0."""
    h = admin()
    tenant = (await new_tenant(api))["id"]
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tenant}, headers=h)).json()
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path)
    for model, cost in (("cheap", 7.5e-8), ("cheap", 1.5e-9), ("tiny", 1.23456789e-9), ("m", 0.1), ("m", 0.2)):
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=key["id"], tenant_id=tenant, model=model, deployment="d",
            provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
            prompt_tokens=1, completion_tokens=1, cost=cost,
        ))  # fmt: skip
    await writer.aclose()
    want = {"cheap": 7.65e-8, "tiny": 1.23456789e-9, "m": 0.3}
    # group_by repeated is every value, as comma-separated is (not the last one alone)
    for query in ("group_by=model&group_by=key", "group_by=model,key"):
        r = await api.get(f"/admin/v1/usage?tenant_id={tenant}&{query}", headers=h)
        assert [(row["model"], row["key"]) for row in r.json()["data"]] == [(m, key["id"]) for m in sorted(want)]
    for r in (await api.get(f"/admin/v1/usage?tenant_id={tenant}&group_by=model", headers=h),
              await api.get("/v1/usage?group_by=model", headers=bearer(key["key"]))):
        assert r.status_code == 200, r.text
        assert {row["model"]: row["cost"] for row in r.json()["data"]} == want


async def _take_database_away(name: str, away: str) -> None:
    """What an outage looks like to the gateway: its connections drop and new ones are refused."""
    conn = await pg_admin()
    try:
        await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
        await conn.execute(f'ALTER DATABASE "{name}" RENAME TO "{away}"')
    finally:
        await conn.close()


async def _bring_database_back(name: str, away: str) -> None:
    conn = await pg_admin()
    try:
        await conn.execute(f'ALTER DATABASE "{away}" RENAME TO "{name}"')
        await conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    finally:
        await conn.close()


async def test_database_outage_is_503_on_admin_and_dashboard_routes(
    fake_upstream_server: FakeUpstream, tmp_path: Path
) -> None:
    from gateway.app import create_app

    name, url = await new_pg_database()
    away = name + "_away"
    await asyncio.to_thread(migrate.upgrade, url)
    settings = gateway_settings(
        fake_upstream_server.url, database={"url": url}, usage={"journal_dir": str(tmp_path / "journal")}
    )
    server = ServerThread(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=20) as client, httpx.Client(base_url=server.url) as dash:
            h = {"authorization": f"Bearer {ADMIN_KEY}"}
            tenant = client.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"}, headers=h).json()
            key = client.post("/admin/v1/keys", json={"tenant_id": tenant["id"]}, headers=h).json()
            admin_key = client.post("/admin/v1/keys", json={"admin": True}, headers=h).json()
            assert login(dash, ADMIN_KEY).status_code == 303  # the config's admin key: a session without a row

            await _take_database_away(name, away)
            try:
                # the config's admin key passes the guard; the service's query finds no database
                r = client.get("/admin/v1/tenants", headers=h)
                assert_error(r, 503)
                assert r.json()["error"]["type"] == "service_unavailable"
                assert r.json()["error"]["code"] == "database_unavailable"
                assert_error(client.get(f"/admin/v1/usage?tenant_id={tenant['id']}", headers=h), 503)
                # keys stored in the database cannot be checked: as on /v1/chat/completions
                for path, token in (("/admin/v1/tenants", admin_key["key"]), ("/v1/usage", key["key"])):
                    r = client.get(path, headers=bearer(token))
                    assert_error(r, 503)
                    assert r.json()["error"]["code"] == "auth_unavailable", path
                r = dash.get(f"/dashboard/api/summary?tenant_id={tenant['id']}")
                assert_error(r, 503)
                assert r.json()["error"]["code"] == "database_unavailable"
                assert login(dash, key["key"]).status_code == 503  # the sign-in form says so, in HTML
            finally:
                await _bring_database_back(name, away)
            deadline = time.monotonic() + 10
            while client.get("/admin/v1/tenants", headers=h).status_code != 200:
                assert time.monotonic() < deadline, "the admin API did not recover"
                await asyncio.sleep(0.1)
            assert client.get("/v1/usage", headers=bearer(key["key"])).status_code == 200
    finally:
        server.stop()
        await drop_pg_database(name)


async def pages(api: httpx.AsyncClient, path: str, limit: int, **query: str) -> list[dict[str, object]]:
    """Every page of a listing, ``limit`` rows at a time, checking each page's own fields."""
    seen: list[dict[str, object]] = []
    after: object = None
    while True:
        params = query | {"limit": limit} | ({"after": after} if after else {})
        body = (await api.get(path, params=params, headers=admin())).raise_for_status().json()
        data = body["data"]
        assert len(data) <= limit
        assert (body["first_id"], body["last_id"]) == ((data[0]["id"], data[-1]["id"]) if data else (None, None))
        seen += data
        if not body["has_more"]:
            return seen
        assert len(data) == limit
        after = body["last_id"]


async def test_listings_page_in_creation_order(api: httpx.AsyncClient) -> None:
    tenant = await new_tenant(api)
    for i in range(5):
        r = await api.post("/admin/v1/keys", json={"tenant_id": tenant["id"], "name": f"k{i}"}, headers=admin())
        assert r.status_code == 201, r.text
    for path, query in ((f"/admin/v1/tenants/{tenant['id']}/keys", {}),
                        ("/admin/v1/keys", {"tenant_id": str(tenant["id"])})):
        whole = (await api.get(path, params=query, headers=admin())).json()
        assert [k["name"] for k in whole["data"]] == [f"k{i}" for i in range(5)] and whole["has_more"] is False
        for limit in (1, 2, 5):
            assert await pages(api, path, limit, **query) == whole["data"]
    whole = (await api.get("/admin/v1/tenants", headers=admin())).json()["data"]
    assert await pages(api, "/admin/v1/tenants", 2) == whole


async def test_a_bad_page_is_400_naming_the_parameter(api: httpx.AsyncClient) -> None:
    for params, param in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"after": "key_missing"}, "after"),
                          ({"after": ""}, "after")):
        assert_error(await api.get("/admin/v1/keys", params=params, headers=admin()), 400, param)


async def test_a_page_after_another_tenants_key_is_400(api: httpx.AsyncClient) -> None:
    """``after`` naming a key outside the listing (another tenant's) once placed the page at that
    key's creation time, silently skipping or repeating rows: it names no row of this listing."""
    mine, theirs = await new_tenant(api), await new_tenant(api)
    for tenant in (mine, theirs):
        assert (await api.post("/admin/v1/keys", json={"tenant_id": tenant["id"]}, headers=admin())).status_code == 201
    other = (await api.get(f"/admin/v1/tenants/{theirs['id']}/keys", headers=admin())).json()["last_id"]
    for path, query in ((f"/admin/v1/tenants/{mine['id']}/keys", {}), ("/admin/v1/keys", {"tenant_id": mine["id"]})):
        assert_error(await api.get(path, params=query | {"after": other}, headers=admin()), 400, "after")
    assert (await api.get("/admin/v1/keys", params={"after": other}, headers=admin())).status_code == 200



def test_an_empty_body_patches_nothing_and_puts_nothing(pg_admin_api: httpx.Client) -> None:
    """Through the real app: a PATCH with no body (zero bytes, or only blanks, compressed or not)
    changes nothing, as ``{}`` does; a PUT of limits with none is a 400 in OpenAI's shape (``{}``
    clears every limit: never an empty body sent by mistake)."""
    api = pg_admin_api
    tenant = api.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"}).json()
    at = f"/admin/v1/tenants/{tenant['id']}"
    assert api.put(f"{at}/limits", json={"requests_per_minute": 7}).status_code == 200
    json_type = {"content-type": "application/json"}
    for body, headers in ((b"", json_type), (b"", {}), (b"  \n", json_type),
                          (gzip.compress(b" "), json_type | {"content-encoding": "gzip"})):
        for path in (at, f"{at}/limits"):
            r = api.patch(path, content=body, headers=headers)
            assert r.status_code == 200, (path, body, r.text)
        assert_error(api.put(f"{at}/limits", content=body, headers=headers), 400)
    assert api.get(f"{at}/limits").json()["requests_per_minute"] == 7
    assert api.get(at).json()["name"] == tenant["name"]
