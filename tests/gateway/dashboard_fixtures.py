"""A gateway on real PostgreSQL with two tenants (A, B) and an admin, and seeded usage with known totals."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.contracts import UsageRecord
from gateway.db import Database
from gateway.usage.pricing import PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import drop_pg_database, new_pg_database
from tests.support.servers import ServerThread


@dataclass
class Tenant:
    id: str
    name: str
    key: str
    key_ids: list[str]
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cost: float


@dataclass
class DashEnv:
    url: str
    a: Tenant
    b: Tenant
    db_url: str


def seed(tenant_id: str, key_ids: list[str], n: int, base: int, now: float) -> list[UsageRecord]:
    out = []
    for i in range(n):
        failed = i % 7 == 3
        out.append(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=key_ids[i % len(key_ids)], tenant_id=tenant_id,
            model=("echo", "other")[i % 2], deployment="d", provider="openai", endpoint="chat.completions",
            started_at=now - 3600 * (i % 40), status=502 if failed else 200,
            error_type="upstream_error" if failed else None, prompt_tokens=0 if failed else base + i,
            completion_tokens=0 if failed else base // 2 + i, cost=0.0 if failed else (base + i) * 1e-4,
            latency_ms=120.0 + i, ttft_ms=None if failed else 30.0 + i,
        ))  # fmt: skip
    return out


def login(client: httpx.Client, key: str) -> httpx.Response:
    """Sign in the way the form does: fetch it (CSRF cookie + field), post the key."""
    form = client.get("/dashboard/login")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    return client.post("/dashboard/login", data={"csrf": token, "api_key": key})


@pytest.fixture(scope="module")
async def dash(fake_upstream_server, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DashEnv]:  # type: ignore[no-untyped-def]
    from gateway.app import create_app

    pg, url = await new_pg_database()
    import asyncio

    from gateway.db import migrate

    await asyncio.to_thread(migrate.upgrade, url)
    settings = gateway_settings(fake_upstream_server.url, database={"url": url},
                                usage={"journal_dir": str(tmp_path_factory.mktemp("journal"))})
    server = ServerThread(create_app(settings)).start()
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    tenants = []
    now = time.time()
    db = Database.from_url(url)
    writer = UsageWriter(db, PriceTable(), journal_dir=Path(tmp_path_factory.mktemp("seedjournal")))
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as client:
        for name, n, base in (("alpha", 90, 40), ("beta", 35, 400)):
            full_name = f"{name}-{uuid.uuid4().hex[:6]}"
            tid = (await client.post("/admin/v1/tenants", json={"name": full_name})).json()["id"]
            keys = [(await client.post("/admin/v1/keys", json={"tenant_id": tid, "name": f"{name}{k}"})).json()
                    for k in range(2)]
            await client.put(
                f"/admin/v1/tenants/{tid}/limits", json={"requests_per_minute": 600, "token_budget": 10**9}
            )
            records = seed(tid, [k["id"] for k in keys], n, base, now)
            for r in records:
                writer.record(r)
            ok = [r for r in records if r.status < 400]
            tenants.append(
                Tenant(
                    tid,
                    full_name,
                    keys[0]["key"],
                    [k["id"] for k in keys],
                    n,
                    n - len(ok),
                    sum(r.prompt_tokens for r in ok),
                    sum(r.completion_tokens for r in ok),
                    sum(r.cost or 0.0 for r in ok),  # each was priced as it was built
                )
            )
    assert await writer.flush()
    writer.journal.close()
    await db.dispose()
    try:
        yield DashEnv(server.url, tenants[0], tenants[1], url)
    finally:
        server.stop()
        await drop_pg_database(pg)
