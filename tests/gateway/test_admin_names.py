"""What the admin API stores for the names an operator types: a key's models and a tenant's name,
on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from litestar import Litestar

from backends.call import MIN_WEIGHT
from gateway.admin.api import admin_routers
from gateway.admin.service import AdminError, TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.db import Database
from tests.gateway.tenancy_fixtures import LoopbackServer, db  # noqa: F401

ADMIN = "sy-admin-" + uuid.uuid4().hex
H = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
async def auth(db: Database) -> SqlAuthenticator:
    return SqlAuthenticator(db, ttl=0.5, admin_key=ADMIN)


@pytest.fixture(scope="module")
async def api(db: Database, auth: SqlAuthenticator) -> AsyncIterator[httpx.AsyncClient]:
    app = Litestar(route_handlers=admin_routers(TenancyService(db, on_change=auth.invalidate), db, auth))
    async with LoopbackServer(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


async def new_tenant(api: httpx.AsyncClient, name: str | None = None) -> httpx.Response:
    return await api.post("/admin/v1/tenants", json={"name": name or f"n-{uuid.uuid4().hex[:8]}"}, headers=H)


async def test_a_keys_models_are_stored_without_surrounding_blanks(api: httpx.AsyncClient,
                                                                   auth: SqlAuthenticator) -> None:
    tid = (await new_tenant(api)).json()["id"]
    r = await api.post("/admin/v1/keys", json={"tenant_id": tid, "models": [" echo ", "echo\t", "other"]}, headers=H)
    assert r.status_code == 201, r.text
    assert r.json()["allowed_models"] == ["echo", "other"]  # a pasted blank would lock the key out of echo
    principal = await auth.authenticate(r.json()["key"])
    assert principal is not None and principal.may_use("echo") and not principal.may_use(" echo ")


async def test_a_tenant_name_shaped_like_a_tenant_id_is_refused(api: httpx.AsyncClient) -> None:
    first = (await new_tenant(api)).json()
    for r in (await new_tenant(api, first["id"]),  # `--tenant <id>` would still mean the first tenant
              await new_tenant(api, "ten_0123456789abcdef"),
              await api.patch(f"/admin/v1/tenants/{first['id']}", json={"name": " ten_fedcba9876543210 "},
                              headers=H)):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "name" and "tenant id" in r.json()["error"]["message"]
    for name in ("ten_0123", "ten_0123456789ABCDEF", "tenant_0123456789abcdef"):  # near the form: names
        assert (await new_tenant(api, name)).status_code == 201


async def test_a_tenant_weight_too_small_for_fair_sharing_is_refused(api: httpx.AsyncClient) -> None:
    for weight in (5e-324, 1e-300, MIN_WEIGHT / 2):  # tokens / weight would overflow the engine's virtual time
        r = await api.post("/admin/v1/tenants", json={"name": f"n-{uuid.uuid4().hex[:8]}", "weight": weight},
                           headers=H)
        assert r.status_code == 400 and r.json()["error"]["param"] == "weight", r.text
    light = (await new_tenant(api)).json()["id"]
    r = await api.patch(f"/admin/v1/tenants/{light}", json={"weight": 1e-300}, headers=H)
    assert r.status_code == 400 and r.json()["error"]["param"] == "weight", r.text
    r = await api.patch(f"/admin/v1/tenants/{light}", json={"weight": MIN_WEIGHT}, headers=H)
    assert r.status_code == 200 and r.json()["weight"] == MIN_WEIGHT, r.text


async def test_the_service_refuses_a_tiny_weight_as_the_api_does(db: Database) -> None:
    svc = TenancyService(db)  # the CLI's way in
    with pytest.raises(AdminError) as err:
        await svc.create_tenant(f"n-{uuid.uuid4().hex[:8]}", weight=1e-300)
    assert err.value.param == "weight" and "[1e-06, 1000000]" in err.value.message
