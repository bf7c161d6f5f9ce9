"""Budgets hold through a Redis outage under ``fail_open``: the spend of the requests served while
Redis could not be reached, and of the settlements it did not acknowledge, is in the budget
buckets once Redis answers again, though the buckets survived in Redis (a network partition, a
paused Redis), once each, whichever replica asks."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.contracts import Principal, QuotaExceeded, Ticket, UsageRecord
from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.stale import StaleBudgets, Uncounted
from gateway.quotas.store import Lease, MemoryStore
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import REDIS_URL, db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import PRICES, principal_with
from tests.support.gated_replica import gated_replica
from tests.support.redis_server import RedisProcess
from tests.support.tcp_gate import TcpGate


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    server = RedisProcess().start()
    yield server
    server.resume()  # a test that failed while it was paused
    server.stop()


def served(adm: QuotaAdmission, writer: UsageWriter, ticket: Ticket, tokens: int) -> None:
    """Settle a request that used ``tokens`` and record its usage, as the pipeline does."""
    p = ticket.principal
    adm.settle(ticket, tokens, 0.0)
    writer.record(UsageRecord(
        request_id=uuid.uuid4().hex, key_id=p.key_id, tenant_id=p.tenant_id, model="m", deployment="d",
        provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
        prompt_tokens=tokens, completion_tokens=0,
    ))  # fmt: skip


async def refused(adm: QuotaAdmission, p: Principal, tokens: int) -> None:
    with pytest.raises(QuotaExceeded, match="token budget"):
        await adm.admit(p, "m", tokens)


async def test_the_spend_of_a_partition_reaches_the_surviving_bucket_once(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path
) -> None:
    """Replica A loses Redis (a partition: the bucket stays there) while it serves 450 tokens
    fail-open and settles a request reserved before at 300 for 100. Once A reaches Redis again,
    replica B, which never lost it, finds 750 of the budget of 1000 spent: 250 more are admitted,
    exactly (the request settled in the outage counts its 100, not its reservation too), and then
    nothing, on either replica."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period="total"), Limits())
    gate = TcpGate("127.0.0.1", 6379)
    port = await gate.start()
    a_client, b_client = connect_redis(f"redis://127.0.0.1:{port}/0", timeout=0.3), connect_redis(REDIS_URL)
    a_writer = UsageWriter(db, PRICES, journal_dir=tmp_path / "a", flush_interval=3600)  # written when flushed
    b_writer = UsageWriter(db, PRICES, journal_dir=tmp_path / "b", flush_interval=3600)
    a = QuotaAdmission(RedisStore(a_client, prefix=redis_prefix), LimitsSource(db), PRICES, on_unavailable="fail_open",
                       flush_records=a_writer.flush)
    b = QuotaAdmission(RedisStore(b_client, prefix=redis_prefix), LimitsSource(db), PRICES, on_unavailable="fail_open",
                       flush_records=b_writer.flush)
    try:
        served(a, a_writer, await a.admit(p, "m", 200), 200)
        running = await a.admit(p, "m", 300)
        await asyncio.sleep(0.1)  # the settlement acknowledged
        gate.black_hole()
        for _ in range(3):
            ticket = await a.admit(p, "m", 150)
            assert isinstance(ticket.reservation, Uncounted)  # served, not counted
            served(a, a_writer, ticket, 150)
        served(a, a_writer, running, 100)  # not acknowledged
        await asyncio.sleep(0.1)
        assert await redis.exists(f"{redis_prefix}:tenant:{p.tenant_id}:bd:total") == 1  # survived the fault
        gate.reopen()
        await asyncio.sleep(2.0)  # A finds Redis again; its repair runs without an admission of its own
        served(b, b_writer, await b.admit(p, "m", 250), 250)  # 750 + 250: the whole budget
        await refused(b, p, 1)
        await refused(a, p, 1)
    finally:
        for adm in (a, b):
            await adm.aclose()
        for writer in (a_writer, b_writer):
            await writer.aclose()
        await a_client.aclose()
        await b_client.aclose()
        await gate.aclose()


async def test_a_reservation_a_paused_redis_ran_late_is_not_counted_twice(
    db: Database, redis_server: RedisProcess, tmp_path: Path
) -> None:
    """Redis pauses: the admission that finds out times out (admitted fail-open), but Redis runs its
    reservation when it resumes, and holds its ticket as in flight; two more are admitted at once.
    The bucket survives with 200 + that reservation; after the repair it counts the 200 and the
    outage's 450, each once: 350 more fit, and not one token beyond."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period="total"), Limits())
    client = connect_redis(redis_server.url, timeout=0.3)
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600)
    adm = QuotaAdmission(RedisStore(client), LimitsSource(db), PRICES, on_unavailable="fail_open",
                         flush_records=writer.flush)
    try:
        served(adm, writer, await adm.admit(p, "m", 200), 200)
        await asyncio.sleep(0.1)
        redis_server.pause()
        try:
            tickets = [await adm.admit(p, "m", 150) for _ in range(3)]  # the first one waits for the timeout
            assert all(isinstance(t.reservation, Uncounted) for t in tickets)
            for t in tickets:
                served(adm, writer, t, 150)
        finally:
            redis_server.resume()
        await asyncio.sleep(1.0)  # the client's recovery PING is answered
        served(adm, writer, await adm.admit(p, "m", 350), 350)
        await refused(adm, p, 1)
    finally:
        await adm.aclose()
        await writer.aclose()
        await client.aclose()


async def test_the_spend_admitted_while_the_limits_were_unreadable_is_counted(
    db: Database, tmp_path: Path
) -> None:
    """The database is down and the limits are not cached: fail_open admits without knowing the
    scopes (the in-process store too). Once the limits can be read again the request's buckets are
    found and rebuilt: its 500 count, once."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period="total"), Limits())
    limits = LimitsSource(db)
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path, flush_interval=3600)
    adm = QuotaAdmission(MemoryStore(), limits, PRICES, on_unavailable="fail_open", flush_records=writer.flush)
    try:
        served(adm, writer, await adm.admit(p, "m", 200), 200)
        limits.invalidate()
        limits.db = Database.from_url(f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'gone.db'}")
        ticket = await adm.admit(p, "m", 500)
        assert isinstance(ticket.reservation, Uncounted) and ticket.reservation.scopes is None
        served(adm, writer, ticket, 500)
        await limits.db.dispose()
        limits.db = db
        served(adm, writer, await adm.admit(p, "m", 300), 300)  # 200 + 500 + 300
        await refused(adm, p, 1)
    finally:
        await adm.aclose()
        await writer.aclose()


async def test_a_charge_redis_did_not_acknowledge_reaches_the_surviving_bucket(
    db: Database, redis_prefix: str, tmp_path: Path
) -> None:
    """A background response's spend (500) is charged while Redis is partitioned away (the bucket
    stays there) and its usage row recorded: once Redis answers again the bucket counts it, so the
    budget of 1000 admits 300 more after the 200 spent before, and not one token beyond."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period="total"), Limits())
    async with gated_replica(db, redis_prefix, PRICES, tmp_path, redis_timeout=0.3) as replica:
        gate, adm, writer = replica.gate, replica.admission, replica.writer
        served(adm, writer, await adm.admit(p, "m", 200), 200)
        await asyncio.sleep(0.1)  # the settlement acknowledged
        gate.black_hole()
        await adm.charge(p, 500, 0.0)  # as gateway.held_usage meters a background response
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=p.key_id, tenant_id=p.tenant_id, model="m", deployment="d",
            provider="openai", endpoint="responses", started_at=time.time(), status=200,
            prompt_tokens=500, completion_tokens=0,
        ))  # fmt: skip
        gate.reopen()
        await asyncio.sleep(2.0)  # Redis found again
        served(adm, writer, await adm.admit(p, "m", 300), 300)  # 200 + 500 + 300
        await refused(adm, p, 1)


async def test_a_long_outage_keeps_a_leases_worth_of_tickets_and_the_hours_of_unread_limits(
    db: Database,
) -> None:
    """Two hours of Redis and the limits away, a request a second: the notes kept to repair the
    budgets stay bounded (tickets whose leases ended are dropped: Redis drops those itself before a
    rebuild; requests admitted without their limits are kept as the hours they came in)."""
    now = [1_800_000_000.0]
    stale = StaleBudgets(MemoryStore(), LimitsSource(db), None, lease_seconds=30, clock=lambda: now[0])
    p = Principal(key_id="key_x", tenant_id="ten_x")
    try:
        for i in range(7200):
            now[0] += 1
            stale.unsettled(Lease(f"t{i}", int(now[0]), 10, 0, [("key", "key_x", "total")]))
            stale.uncounted(p, Uncounted(None, now[0], None))
        assert len(stale._tickets) <= 32 and len(stale._unresolved[("key_x", "ten_x")][1]) <= 3
        assert list(stale._buckets) == [("key", "key_x", "total")]  # still to rebuild
    finally:
        await stale.aclose()
