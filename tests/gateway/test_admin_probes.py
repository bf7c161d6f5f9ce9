"""Operator probes of the admin API: renames, key creation edge cases and usage report ranges,
on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from litestar import Litestar

from gateway.admin.api import admin_routers
from gateway.admin.service import TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import LoopbackServer, db  # noqa: F401

ADMIN = "sy-admin-" + uuid.uuid4().hex
H = {"authorization": f"Bearer {ADMIN}"}
DAY = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.fixture(scope="module")
async def api(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    auth = SqlAuthenticator(db, ttl=0.5, admin_key=ADMIN)
    app = Litestar(route_handlers=admin_routers(TenancyService(db, on_change=auth.invalidate), db, auth))
    async with LoopbackServer(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.text


async def new_tenant(api: httpx.AsyncClient) -> dict[str, str]:
    r = await api.post("/admin/v1/tenants", json={"name": f"p-{uuid.uuid4().hex[:8]}"}, headers=H)
    assert r.status_code == 201, r.text
    return r.json()


async def write_usage(db: Database, tmp_path: Path, tenant: str, times: list[float], key_id: str = "k") -> None:
    writer = UsageWriter(db, PriceTable(), journal_dir=tmp_path / uuid.uuid4().hex)
    for at in times:
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=key_id, tenant_id=tenant, model="m", deployment="d",
            provider="openai", endpoint="chat.completions", started_at=at, status=200,
            prompt_tokens=10, completion_tokens=5, cost=0.1,
        ))  # fmt: skip
    await writer.aclose()


async def test_renaming_a_tenant_to_a_taken_name_is_a_409(api: httpx.AsyncClient) -> None:
    a, b = await new_tenant(api), await new_tenant(api)
    assert_error(await api.patch(f"/admin/v1/tenants/{a['id']}", json={"name": b["name"]}, headers=H), 409, "name")
    renamed = await api.patch(f"/admin/v1/tenants/{a['id']}", json={"name": a["name"] + "-x"}, headers=H)
    assert renamed.json()["name"] == a["name"] + "-x"
    assert (await api.get(f"/admin/v1/tenants/{a['name']}-x", headers=H)).json()["id"] == a["id"]


async def test_key_edge_cases(api: httpx.AsyncClient) -> None:
    tid = (await new_tenant(api))["id"]
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tid}, headers=H)).json()
    again = await api.post(f"/admin/v1/keys/{key['id']}/revoke", headers=H)
    assert again.status_code == 200
    first = (await api.post(f"/admin/v1/keys/{key['id']}/revoke", headers=H)).json()
    assert first["revoked_at"] == again.json()["revoked_at"]
    assert_error(await api.post(f"/admin/v1/keys/{key['id']}/rotate", headers=H), 400, "key_id")
    live = (await api.post("/admin/v1/keys", json={"tenant_id": tid}, headers=H)).json()
    assert (await api.post(f"/admin/v1/keys/{live['id']}/rotate", headers=H)).status_code == 201
    assert_error(await api.post(f"/admin/v1/keys/{live['id']}/rotate", headers=H), 409, "key_id")
    assert_error(await api.get("/admin/v1/keys/key_nope/limits", headers=H), 404, "key_id")


async def test_usage_range_boundaries_and_time_zones(api: httpx.AsyncClient, db: Database,
                                                     tmp_path: Path) -> None:
    tid = (await new_tenant(api))["id"]
    await write_usage(db, tmp_path, tid, [DAY - 1, DAY, DAY + 86399, DAY + 86400])

    async def count(**q: str) -> int:
        r = await api.get("/admin/v1/usage", params={"tenant_id": tid, "group_by": "tenant", **q}, headers=H)
        assert r.status_code == 200, r.text
        return sum(row["requests"] for row in r.json()["data"])

    assert await count(start="2026-01-01", end="2026-01-01") == 2
    assert await count(start="2026-01-01T00:00:00", end="2026-01-02T00:00:00") == 2
    assert await count(start="2026-01-01T01:00:00+01:00", end="2026-01-01T00:00:01Z") == 1
    assert await count(start="2026-01-02") == 1
    assert await count(end="2025-12-31") == 1
    assert await count(start="2026-01-01", end="2099-01-01") == 3
    assert await count(start="2030-01-01") == 0
    days = (await api.get("/admin/v1/usage", params={"tenant_id": tid, "group_by": "day"}, headers=H)).json()
    assert [(r["day"], r["requests"]) for r in days["data"]] == [("2025-12-31", 1), ("2026-01-01", 2),
                                                                 ("2026-01-02", 1)]
    assert round(sum(r["cost"] for r in days["data"]), 8) == 0.4


async def test_usage_by_tenant_name_or_unknown_tenant(api: httpx.AsyncClient, db: Database,
                                                      tmp_path: Path) -> None:
    """The admin API names a tenant by id or name everywhere (as the CLI's --tenant does)."""
    tenant = await new_tenant(api)
    await write_usage(db, tmp_path, tenant["id"], [DAY])
    by_name = await api.get("/admin/v1/usage", params={"tenant_id": tenant["name"], "group_by": "tenant"}, headers=H)
    assert [(r["tenant"], r["requests"]) for r in by_name.json()["data"]] == [(tenant["id"], 1)]
    assert_error(await api.get("/admin/v1/usage?tenant_id=ten_nope", headers=H), 404, "tenant_id")


async def test_usage_start_after_end_is_a_400(api: httpx.AsyncClient) -> None:
    r = await api.get("/admin/v1/usage?start=2026-02-01&end=2026-01-01", headers=H)
    assert_error(r, 400, "start")


async def test_an_empty_model_list_is_refused_not_all_models(api: httpx.AsyncClient) -> None:
    tid = (await new_tenant(api))["id"]
    assert_error(await api.post("/admin/v1/keys", json={"tenant_id": tid, "models": []}, headers=H), 400, "models")


async def test_a_key_expiring_in_the_past_is_refused(api: httpx.AsyncClient) -> None:
    tid = (await new_tenant(api))["id"]
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "expires_at": past}, headers=H)
    assert_error(r, 400, "expires_at")


async def test_audit_by_tenant_name_or_unknown_tenant(api: httpx.AsyncClient) -> None:
    tenant = await new_tenant(api)
    assert (await api.get("/admin/v1/audit", params={"tenant_id": tenant["name"]}, headers=H)).status_code == 200
    assert_error(await api.get("/admin/v1/audit?tenant_id=ten_nope", headers=H), 404, "tenant_id")


async def test_an_unknown_tenant_in_the_path_is_a_404_naming_tenant_id(api: httpx.AsyncClient) -> None:
    """The path's parameter is ``tenant_id`` (as an unknown key's 404 names ``key_id``); these once named
    ``tenant``, which no request of the API holds."""
    for method, path in (("GET", ""), ("PATCH", ""), ("POST", "/disable"), ("POST", "/enable"), ("GET", "/keys"),
                         ("GET", "/limits"), ("PUT", "/limits"), ("PATCH", "/limits")):
        body = {} if method in ("PUT", "PATCH") else None
        assert_error(await api.request(method, f"/admin/v1/tenants/ten_nope{path}", json=body, headers=H), 404,
                     "tenant_id")


async def test_audit_of_an_unknown_key_is_a_404_not_an_empty_trail(api: httpx.AsyncClient) -> None:
    """As at /admin/v1/usage: a typo in key_id once read as "no events"; the config's admin key,
    which has no row, is known."""
    assert_error(await api.get("/admin/v1/audit?key_id=key_nope", headers=H), 404, "key_id")
    key = (await api.post("/admin/v1/keys", json={"tenant_id": (await new_tenant(api))["id"]}, headers=H)).json()
    for key_id in (key["id"], "admin:config"):
        r = await api.get("/admin/v1/audit", params={"key_id": key_id}, headers=H)
        assert r.status_code == 200 and r.json()["object"] == "list", r.text


async def test_an_end_date_in_basic_form_includes_its_day(api: httpx.AsyncClient, db: Database,
                                                          tmp_path: Path) -> None:
    """``20260101`` is the same bare date as ``2026-01-01``: the whole day, not its first instant."""
    tid = (await new_tenant(api))["id"]
    await write_usage(db, tmp_path, tid, [DAY + 3600])
    for end in ("2026-01-01", "20260101"):
        r = await api.get("/admin/v1/usage", params={"tenant_id": tid, "start": "2026-01-01", "end": end}, headers=H)
        assert [row["requests"] for row in r.json()["data"]] == [1], end


async def test_revocations_at_once_keep_the_first_ones_time(api: httpx.AsyncClient) -> None:
    """Revoking is idempotent under concurrency too: every answer, and the key, show one time."""
    tid = (await new_tenant(api))["id"]
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tid}, headers=H)).json()
    answers = await asyncio.gather(*(api.post(f"/admin/v1/keys/{key['id']}/revoke", headers=H) for _ in range(6)))
    assert {r.status_code for r in answers} == {200}
    stored = (await api.get(f"/admin/v1/keys/{key['id']}", headers=H)).json()["revoked_at"]
    assert {r.json()["revoked_at"] for r in answers} == {stored}
    assert_error(await api.post("/admin/v1/keys/key_nope/revoke", headers=H), 404, "key_id")


async def test_usage_of_an_unknown_key_is_a_404_not_an_empty_range(api: httpx.AsyncClient, db: Database,
                                                                   tmp_path: Path) -> None:
    """As for an unknown tenant (and the CLI's --key): a typo in key_id must not read as "no usage"."""
    tid = (await new_tenant(api))["id"]
    key = (await api.post("/admin/v1/keys", json={"tenant_id": tid}, headers=H)).json()
    await write_usage(db, tmp_path, tid, [DAY], key_id=key["id"])
    mine = await api.get("/admin/v1/usage", params={"key_id": key["id"], "group_by": "key"}, headers=H)
    assert [(r["key"], r["requests"]) for r in mine.json()["data"]] == [(key["id"], 1)]
    assert_error(await api.get("/admin/v1/usage?key_id=key_nope", headers=H), 404, "key_id")
