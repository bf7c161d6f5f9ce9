"""Money budgets count what the usage records say, fractions of a micro-dollar included."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.contracts import Principal, QuotaExceeded, UsageRecord
from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import MemoryStore, QuotaStore
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import REDIS_URL, db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import PRICES, principal_with

CHEAP = 4e-7  # USD: under half a micro-dollar, which whole micro-dollars rounded to nothing


def _store(kind: str, redis_prefix: str) -> QuotaStore:
    return MemoryStore() if kind == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)


async def _admitted_until_refused(adm: QuotaAdmission, p: Principal, cost: float, most: int) -> int:
    """Admit and settle requests that reserve nothing and cost ``cost`` until one is refused."""
    for n in range(most):
        try:
            ticket = await adm.admit(p, "m", 0)
        except QuotaExceeded as exc:
            assert "spending budget" in exc.message
            return n
        await adm.settle(ticket, 0, cost)
    return most


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_cheap_requests_exhaust_a_money_budget(
    db: Database, redis: Redis, redis_prefix: str, store_kind: str
) -> None:
    """25 requests of 0.4 micro-dollars spend a budget of 10 micro-dollars exactly (still admitted:
    nothing more is reserved); the 26th goes past it, and the 27th is refused."""
    p = await principal_with(db, Limits(cost_budget=0.00001, budget_period="total"), Limits())
    adm = QuotaAdmission(_store(store_kind, redis_prefix), LimitsSource(db), PRICES)
    assert await _admitted_until_refused(adm, p, CHEAP, 100) == 26
    await adm.aclose()


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_budget_rebuilt_from_the_records_counts_their_fractions(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path, store_kind: str
) -> None:
    """A bucket rebuilt from usage rows of 0.4 micro-dollars each holds their exact sum."""
    p = await principal_with(db, Limits(cost_budget=0.00001, budget_period="month"), Limits())
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path)
    for _ in range(20):  # 8 micro-dollars
        writer.record(UsageRecord(
            request_id=uuid.uuid4().hex, key_id=p.key_id, tenant_id=p.tenant_id, model="m", deployment="d",
            provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
            prompt_tokens=0, completion_tokens=0, cost=CHEAP,
        ))  # fmt: skip
    await writer.aclose()
    adm = QuotaAdmission(_store(store_kind, redis_prefix), LimitsSource(db), PRICES)
    assert await _admitted_until_refused(adm, p, CHEAP, 100) == 6  # 8 + 5 x 0.4 = 10, the 6th goes past
    await adm.aclose()


async def test_an_older_replica_reads_the_whole_micro_dollars(db: Database, redis: Redis, redis_prefix: str) -> None:
    """The bucket keeps ``micros`` whole micro-dollars (what a replica of the older version reads
    and adds to, in a rolling update) and the pico-dollars past them in ``picos``; what an older
    replica adds to ``micros`` counts for the newer ones."""
    p = await principal_with(db, Limits(cost_budget=0.00001, budget_period="total"), Limits())
    adm = QuotaAdmission(_store("redis", redis_prefix), LimitsSource(db), PRICES)
    for _ in range(3):
        await adm.settle(await adm.admit(p, "m", 0), 0, CHEAP)
    bucket = f"{redis_prefix}:tenant:{p.tenant_id}:bd:total"
    budget = await redis.hgetall(bucket)
    assert (int(budget[b"micros"]), int(budget[b"picos"])) == (1, 200_000)  # 1.2 micro-dollars
    await redis.hincrby(bucket, "micros", 8)  # an older replica's settlement of 8 micro-dollars
    assert await _admitted_until_refused(adm, p, CHEAP, 100) == 3  # 9.2 -> 9.6 -> 10.0 -> 10.4: refused
    await adm.aclose()
