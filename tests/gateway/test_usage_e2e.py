"""Metering through a PostgreSQL outage: a gateway process under load while its database goes away
(connections terminated, database renamed so reconnects fail; or silent, behind a black hole)
and comes back. Every request ends up as exactly one usage row: none lost, none doubled; SIGTERM
flushes what is still buffered."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
from sqlalchemy import select
from sqlalchemy.engine import make_url

from gateway.db import Database
from gateway.db.models import UsageRow
from tests.conftest import ADMIN_KEY
from tests.gateway.tenancy_fixtures import (  # noqa: F401
    PG_HOST,
    PG_PORT,
    GatewayProcess,
    database,
    pg_admin,
    pg_url,
)
from tests.support.fake_upstream import FakeUpstream
from tests.support.tcp_gate import TcpGate

CHAT = [{"role": "user", "content": "count me exactly once"}]


def echo_config(db_url: str, upstream: FakeUpstream) -> dict[str, Any]:
    """A gateway on ``db_url`` with model ``echo`` on the fake upstream, and keys cached for 1 s."""
    return {
        "auth": {"admin_key": ADMIN_KEY, "key_cache_seconds": 1},
        "database": {"url": db_url},
        "models": [{"name": "echo", "deployments": [
            {"provider": "openai", "model": "upstream-echo", "api_base": upstream.url, "api_key": "k"}]}],
    }  # fmt: skip


async def new_tenant_key(gw: GatewayProcess) -> tuple[str, str]:
    """A new tenant and a key of it, made through the admin API: (tenant id, key)."""
    async with httpx.AsyncClient(base_url=gw.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        tid = (await admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:6]}"})).json()["id"]
        return tid, (await admin.post("/admin/v1/keys", json={"tenant_id": tid})).json()["key"]


async def behind_a_gate(pg_url: str, upstream: FakeUpstream, workdir: Path) -> tuple[TcpGate, dict[str, Any],
                                                                                   GatewayProcess]:
    """A gateway process reaching PostgreSQL through a ``TcpGate`` (which runs on this loop, so
    the process is started from a thread): (the gate, the gateway's config, the gateway)."""
    gate = TcpGate(PG_HOST, PG_PORT)
    via_gate = make_url(pg_url).set(host="127.0.0.1", port=await gate.start())
    config = echo_config(via_gate.render_as_string(hide_password=False), upstream)
    return gate, config, await asyncio.to_thread(GatewayProcess(config, workdir).start)


async def outage(name: str, seconds: float) -> None:
    """Cut every connection to database ``name`` and keep new ones out for ``seconds``."""
    hidden = name + "_away"
    conn = await pg_admin()
    try:
        for _ in range(200):  # the gateway reconnects quickly; retry until the rename wins the race
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
            try:
                await conn.execute(f'ALTER DATABASE "{name}" RENAME TO "{hidden}"')
                break
            except Exception:
                await asyncio.sleep(0.01)
        else:
            raise AssertionError("could not take the database away")
        await asyncio.sleep(seconds)
        await conn.execute(f'ALTER DATABASE "{hidden}" RENAME TO "{name}"')
    finally:
        await conn.close()


async def test_postgres_outage_during_load_loses_and_doubles_nothing(
    pg_url: str, database: Database, fake_upstream_server: FakeUpstream, tmp_path: Path
) -> None:
    gw = GatewayProcess(echo_config(pg_url, fake_upstream_server), tmp_path).start()
    try:
        tid, key = await new_tenant_key(gw)
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=30)
        request_ids: list[str] = []
        failures: list[BaseException] = []
        done = asyncio.Event()

        async def worker() -> None:
            while not done.is_set():
                try:
                    raw = await client.chat.completions.with_raw_response.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
                    request_ids.append(raw.headers["x-request-id"])
                except Exception as exc:
                    failures.append(exc)
                await asyncio.sleep(0.01)

        async def until(count: int) -> None:
            while len(request_ids) < count and not failures:
                await asyncio.sleep(0.02)

        load = asyncio.gather(*(worker() for _ in range(6)))
        await until(40)  # before: the key is known and cached
        during = len(request_ids)
        await outage(make_url(pg_url).database or "", seconds=2.5)
        during = len(request_ids) - during
        await until(len(request_ids) + 40)  # after the database is back
        done.set()
        await load
        await client.close()
    finally:
        # SIGTERM: a graceful shutdown that flushes the usage buffer (uvicorn re-raises the signal)
        assert gw.stop() in (0, -15)
    assert not failures, failures[:3]
    assert during > 0  # requests kept being served while the database was away
    assert "journaling" in gw.log_path.read_text()  # the writer really hit the outage
    async with database.session() as s:
        stored = (await s.scalars(select(UsageRow.request_id).where(UsageRow.tenant_id == tid))).all()
    assert len(stored) == len(set(stored)) == len(request_ids)
    assert set(stored) == set(request_ids)


async def test_a_database_that_stops_answering_holds_up_one_request_not_every_one(
    pg_url: str, database: Database, fake_upstream_server: FakeUpstream, tmp_path: Path
) -> None:
    """The database goes silent (connections dropped, new ones never answered: a connect waits
    for its 5 s timeout). The first request to find its key's cache entry expired waits for that;
    the ones after it are answered from the entries at once while loads retry behind them. When
    the database answers again every request is in it, once."""
    gate, _, gw = await behind_a_gate(pg_url, fake_upstream_server, tmp_path)
    try:
        tid, key = await new_tenant_key(gw)
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60)
        request_ids: list[str] = []

        async def timed_request() -> float:
            t0 = time.monotonic()
            raw = await client.chat.completions.with_raw_response.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
            request_ids.append(raw.headers["x-request-id"])
            return time.monotonic() - t0

        for _ in range(10):
            await timed_request()
        gate.black_hole()
        await asyncio.sleep(2.2)  # the key's and its limits' entries expire (1 s and 2 s)
        first = await timed_request()
        after = [await timed_request() for _ in range(30)]
        assert first >= 4.0  # it waited for a connect to time out
        assert max(after) < 2.0, after  # the others did not wait for the database
        gate.reopen()
        await asyncio.sleep(1.5)  # a retry finds the database again
        for _ in range(10):
            await timed_request()
        await client.close()
    finally:
        assert await asyncio.to_thread(gw.stop) in (0, -15)
        await gate.aclose()
    log = gw.log_path.read_text()
    assert "api keys: loads failing" in log and "api keys: loads work again" in log
    async with database.session() as s:
        stored = (await s.scalars(select(UsageRow.request_id).where(UsageRow.tenant_id == tid))).all()
    assert sorted(stored) == sorted(request_ids)


async def test_sigterm_while_the_database_is_silent_exits_and_the_next_start_writes_every_record(
    pg_url: str, database: Database, fake_upstream_server: FakeUpstream, tmp_path: Path
) -> None:
    """A gateway stopped while its database does not answer does not wait for it past its shutdown
    bound (``stop`` allows 30 s): the records it could not write wait in its journal folder, and
    the next gateway started there writes them, each once."""
    gate, config, gw = await behind_a_gate(pg_url, fake_upstream_server, tmp_path)
    try:
        tid, key = await new_tenant_key(gw)
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60)
        request_ids = []
        for i in range(20):
            if i == 10:
                gate.black_hole()
            raw = await client.chat.completions.with_raw_response.create(model="echo", messages=CHAT)  # type: ignore[arg-type]
            request_ids.append(raw.headers["x-request-id"])
        await client.close()
        t0 = time.monotonic()
        assert await asyncio.to_thread(gw.stop) in (0, -15)  # with the database still silent
        assert time.monotonic() - t0 < 20  # its bound is 10 s (a wait for each failed connect was 26 s)
        assert "did not take the last records" in gw.log_path.read_text()
        gate.reopen()
        after = await asyncio.to_thread(GatewayProcess(config, tmp_path).start)  # the same journal folder
        try:
            deadline = time.monotonic() + 20
            while True:
                async with database.session() as s:
                    stored = (await s.scalars(select(UsageRow.request_id).where(UsageRow.tenant_id == tid))).all()
                if len(stored) >= len(request_ids) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert sorted(stored) == sorted(request_ids)
        finally:
            assert await asyncio.to_thread(after.stop) in (0, -15)
    finally:
        await asyncio.to_thread(gw.stop)
        await gate.aclose()
