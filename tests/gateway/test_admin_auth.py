"""The admin API's and /v1/usage's refusals of a missing or wrong key carry the same error codes as
the API's other routes (OpenAI's ``invalid_api_key``), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from litestar import Litestar

from gateway.admin.api import admin_routers
from gateway.admin.service import TenancyService
from gateway.auth.authenticator import SqlAuthenticator
from gateway.db import Database
from tests.gateway.tenancy_fixtures import LoopbackServer, db  # noqa: F401

ADMIN = "sy-admin-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
async def api(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    auth = SqlAuthenticator(db, ttl=0.5, admin_key=ADMIN)
    app = Litestar(route_handlers=admin_routers(TenancyService(db, on_change=auth.invalidate), db, auth))
    async with LoopbackServer(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("path", ["/admin/v1/tenants", "/v1/usage"])
async def test_a_missing_or_wrong_key_is_401_with_the_apis_codes(api: httpx.AsyncClient, path: str) -> None:
    for headers, code in (({}, "missing_api_key"),
                          ({"authorization": "Basic abc"}, "missing_api_key"),
                          ({"authorization": "Bearer sk-sy-" + "x" * 43}, "invalid_api_key"),
                          ({"authorization": f"Bearer {ADMIN}x"}, "invalid_api_key")):
        r = await api.get(path, headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["code"] == code, r.text
