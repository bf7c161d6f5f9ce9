"""QuotaAdmission: limits from SQL, reservations of tokens and money, Redis outage policies."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from redis.asyncio import Redis

from gateway.admin.service import TenancyService
from gateway.contracts import Principal, QuotaExceeded, QuotaUnavailable, UsageRecord
from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.stale import Uncounted
from gateway.quotas.store import MemoryStore
from gateway.usage.pricing import Price, PriceTable
from gateway.usage.writer import UsageWriter
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.gateway.tenancy_fixtures import REDIS_URL, db, plain_url, redis, redis_prefix  # noqa: F401
from tests.support.fake_upstream import FakeUpstream
from tests.support.redis_server import RedisProcess
from tests.support.servers import ServerThread

DEAD_REDIS = "redis://127.0.0.1:9/0"  # nothing listens on port 9
PRICES = PriceTable({"m": Price(input_per_million=1.0, output_per_million=3.0)})


async def principal_with(db: Database, tenant: Limits, key: Limits) -> Principal:
    svc = TenancyService(db)
    t = await svc.create_tenant(f"adm-{os.urandom(4).hex()}")
    k = await svc.create_key(t.id)
    await svc.set_limits("tenant", t.id, tenant)
    await svc.set_limits("key", k.key.id, key)
    return Principal(key_id=k.key.id, tenant_id=t.id)


async def test_key_and_tenant_limits_from_sql(db: Database) -> None:
    p = await principal_with(db, Limits(requests_per_minute=3), Limits(tokens_per_minute=250))
    adm = QuotaAdmission(MemoryStore(), LimitsSource(db), PRICES)
    first = await adm.admit(p, "m", 100)
    assert first.requests is not None and (first.requests.limit, first.requests.remaining) == (3, 2)
    assert first.tokens is not None and (first.tokens.limit, first.tokens.remaining) == (250, 150)
    await adm.admit(p, "m", 100)
    with pytest.raises(QuotaExceeded) as over:
        await adm.admit(p, "m", 100)  # 300 > 250 tokens/min for the key
    assert "tokens per minute" in over.value.message and over.value.retry_after > 0
    await adm.settle(first, 10, 0.0)  # correct 100 reserved to 10 used
    third = await adm.admit(p, "m", 100)
    with pytest.raises(QuotaExceeded) as over:
        await adm.admit(p, "m", 1)  # the tenant's 3 requests/min
    assert "requests per minute" in over.value.message and "tenant" in over.value.message
    assert over.value.ticket is not None and over.value.ticket.requests is not None
    assert third.reservation is not None


async def test_money_is_reserved_at_the_highest_price(db: Database) -> None:
    # 1000 tokens at 3 USD per million (the output price) = 0.003 reserved per request
    p = await principal_with(db, Limits(cost_budget=0.0075, budget_period="total"), Limits())
    adm = QuotaAdmission(MemoryStore(), LimitsSource(db), PRICES)
    a = await adm.admit(p, "m", 1000)
    await adm.admit(p, "m", 1000)
    with pytest.raises(QuotaExceeded, match="spending budget"):
        await adm.admit(p, "m", 1000)
    await adm.settle(a, 1000, 0.001)  # it cost less than reserved
    await adm.admit(p, "m", 1000)


async def test_redis_down_fail_closed_raises_unavailable(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    p = await principal_with(db, Limits(requests_per_minute=1), Limits())
    redis = connect_redis(DEAD_REDIS, timeout=0.5)
    adm = QuotaAdmission(RedisStore(redis), LimitsSource(db), PRICES)
    with caplog.at_level(logging.ERROR, "switchyard.quotas"), pytest.raises(QuotaUnavailable):
        await adm.admit(p, "m", 10)
    assert "quota store unavailable" in caplog.text
    await redis.aclose()


async def test_redis_down_fail_open_admits_without_counting(db: Database) -> None:
    p = await principal_with(db, Limits(requests_per_minute=1), Limits())
    redis = connect_redis(DEAD_REDIS, timeout=0.5)
    adm = QuotaAdmission(RedisStore(redis), LimitsSource(db), PRICES, on_unavailable="fail_open")
    tickets = [await adm.admit(p, "m", 10) for _ in range(3)]
    assert all(isinstance(t.reservation, Uncounted) and t.requests is None for t in tickets)
    for t in tickets:
        await adm.settle(t, 5, 0.0)  # nothing was reserved: its buckets are rebuilt once Redis is back
    await adm.aclose()
    await redis.aclose()


async def test_the_heartbeat_keeps_a_live_lease_and_a_dead_ones_expires(db: Database) -> None:
    p = await principal_with(db, Limits(max_concurrency=1), Limits())
    live = QuotaAdmission(MemoryStore(), LimitsSource(db), PRICES, lease_seconds=1.0)
    live.start()
    held = await live.admit(p, "m", 10)
    await asyncio.sleep(1.6)  # past its first term: renewed meanwhile
    with pytest.raises(QuotaExceeded, match="concurrent"):
        await live.admit(p, "m", 10)
    await live.aclose()  # the replica stops beating (as if it died)
    await asyncio.sleep(1.2)
    await live.settle(await live.admit(p, "m", 10), 5, 0.0)  # the slot freed itself within a lease
    await live.settle(held, 5, 0.0)


async def test_a_settlement_is_sent_at_once_and_awaited_at_close(
    db: Database, redis: Redis, redis_prefix: str
) -> None:
    p = await principal_with(db, Limits(max_concurrency=1, token_budget=1000, budget_period="total"), Limits())
    client = connect_redis(REDIS_URL)
    adm = QuotaAdmission(RedisStore(client, prefix=redis_prefix), LimitsSource(db), PRICES)
    ticket = await adm.admit(p, "m", 600)
    acknowledged = adm.settle(ticket, 100, 0.0)  # not awaited: the next admission still sees it
    assert not acknowledged.done()
    again = await adm.admit(p, "m", 600)  # the slot is free and 100 + 600 <= 1000
    adm.settle(again, 600, 0.0)
    await adm.aclose()  # waits for the settlement on its way
    budget = await redis.hgetall(f"{redis_prefix}:tenant:{p.tenant_id}:bd:total")
    assert int(budget[b"tokens"]) == 700 and acknowledged.done()
    assert await redis.zcard(f"{redis_prefix}:tenant:{p.tenant_id}:cc") == 0
    await client.aclose()


async def test_an_admission_cancelled_while_redis_reserves_gives_the_reservation_back(
    db: Database, redis: Redis, redis_prefix: str
) -> None:
    """The client left (its request cancelled) after the reservation went to Redis: the slot and
    the tokens it took are freed at once, not held until the lease expires."""
    p = await principal_with(db, Limits(max_concurrency=1, token_budget=1000, budget_period="total"), Limits())
    client = connect_redis(REDIS_URL)
    adm = QuotaAdmission(RedisStore(client, prefix=redis_prefix), LimitsSource(db), PRICES, lease_seconds=60)
    await adm.settle(await adm.admit(p, "m", 100), 100, 0.0)  # limits cached: the next admission goes to Redis at once
    task = asyncio.create_task(adm.admit(p, "m", 600))
    await asyncio.sleep(0)  # sent, its answer not read yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert await redis.zcard(f"{redis_prefix}:tenant:{p.tenant_id}:cc") == 0
    budget = await redis.hgetall(f"{redis_prefix}:tenant:{p.tenant_id}:bd:total")
    assert int(budget[b"tokens"]) == 100
    adm.settle(await adm.admit(p, "m", 900), 900, 0.0)  # the slot is free, and the 600 not held
    await adm.aclose()
    await client.aclose()


async def test_a_settlement_redis_refuses_is_logged_not_raised(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    p = await principal_with(db, Limits(requests_per_minute=100), Limits())
    server = RedisProcess().start()
    client = connect_redis(server.url, timeout=0.5)
    try:
        adm = QuotaAdmission(RedisStore(client), LimitsSource(db), PRICES)
        ticket = await adm.admit(p, "m", 10)
        server.stop()  # Redis is gone by the time the settlement goes out
        with caplog.at_level(logging.ERROR, "switchyard.quotas"):
            await adm.settle(ticket, 5, 0.0)  # completes (the lease expires by itself), never raises
        assert "quota store unavailable during settle" in caplog.text
        await adm.aclose()  # its bucket would be rebuilt once Redis is back
    finally:
        await client.aclose()
        server.stop()


@pytest.mark.parametrize("policy", ["fail_closed", "fail_open"])
async def test_a_lost_budget_is_not_handed_out_while_the_records_cannot_be_read(
    db: Database, tmp_path: Path, policy: str
) -> None:
    """The store lost the budget bucket and the database is down: fail_closed refuses (503) rather
    than count the budget from zero; fail_open admits without counting, as for a store outage."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period="total"), Limits())
    limits = LimitsSource(db)
    await limits.scopes(p)  # the limits are cached: only the spend is unreadable
    limits.db = Database.from_url(f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'gone.db'}")
    adm = QuotaAdmission(MemoryStore(), limits, PRICES, on_unavailable=policy)  # type: ignore[arg-type]
    if policy == "fail_closed":
        with pytest.raises(QuotaUnavailable):
            await adm.admit(p, "m", 10)
    else:
        assert isinstance((await adm.admit(p, "m", 10)).reservation, Uncounted)
    await limits.db.dispose()


@pytest.fixture
def gateway_without_redis(
    db: Database, fake_upstream_server: FakeUpstream, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """A gateway whose configured Redis is unreachable (fail_closed), and a tenant key for it."""
    from gateway.app import create_app

    settings = gateway_settings(
        fake_upstream_server.url, database={"url": plain_url(db)}, redis={"url": DEAD_REDIS},
        usage={"journal_dir": str(tmp_path)},
    )  # fmt: skip
    with ServerThread(create_app(settings)) as server:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        tid = httpx.post(server.url + "/admin/v1/tenants", json={"name": os.urandom(4).hex()}, headers=admin).json()[
            "id"
        ]
        key = httpx.post(server.url + "/admin/v1/keys", json={"tenant_id": tid}, headers=admin).json()["key"]
        yield server.url, key


def test_gateway_answers_503_when_redis_is_down(gateway_without_redis: tuple[str, str]) -> None:
    url, key = gateway_without_redis
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    for _ in range(2):  # and keeps answering: no crash
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
        assert failed.value.status_code == 503
        assert failed.value.body["code"] == "quota_unavailable"  # type: ignore[index]
    assert httpx.get(url + "/healthz").status_code == 200


async def _spent_900_tokens(db: Database, p: Principal, tmp_path: Path) -> None:
    """A usage row of 900 tokens this month for ``p``, written before the store under test starts."""
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path)
    writer.record(UsageRecord(
        request_id=uuid.uuid4().hex, key_id=p.key_id, tenant_id=p.tenant_id, model="m", deployment="d",
        provider="openai", endpoint="chat.completions", started_at=time.time(), status=200,
        prompt_tokens=600, completion_tokens=300,
    ))  # fmt: skip
    await writer.aclose()


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_budget_survives_a_store_restart(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path, store_kind: str
) -> None:
    """A fresh store (restarted gateway, flushed Redis) starts the budget from the usage records."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period="month"), Limits())
    await _spent_900_tokens(db, p, tmp_path)
    store = MemoryStore() if store_kind == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    adm = QuotaAdmission(store, LimitsSource(db), PRICES)
    with pytest.raises(QuotaExceeded, match="token budget"):
        await adm.admit(p, "m", 200)  # 900 already spent this month
    ticket = await adm.admit(p, "m", 100)
    await adm.settle(ticket, 100, 0.0)
    with pytest.raises(QuotaExceeded):
        await adm.admit(p, "m", 1)


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_budget_set_after_a_store_restart_counts_the_period_already_spent(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path, store_kind: str
) -> None:
    """A fresh store admits a tenant without a budget; a budget set afterwards in the same period
    still counts what the usage records show for the period (the restart lost it from the store)."""
    p = await principal_with(db, Limits(), Limits())
    await _spent_900_tokens(db, p, tmp_path)
    store = MemoryStore() if store_kind == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    limits = LimitsSource(db)
    adm = QuotaAdmission(store, limits, PRICES)
    await adm.settle(await adm.admit(p, "m", 50), 50, 0.0)  # no budget yet: admitted
    assert p.tenant_id is not None
    await TenancyService(db).update_limits("tenant", p.tenant_id, token_budget=1000)
    limits.invalidate()
    with pytest.raises(QuotaExceeded, match="token budget"):
        await adm.admit(p, "m", 150)  # 900 spent this month before the restart (it was taken as 50)
    await adm.admit(p, "m", 100)


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_budget_set_while_requests_are_in_flight_counts_their_reservations(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path, store_kind: str
) -> None:
    """Requests admitted before the tenant had a budget, and not settled yet, are in no usage record:
    the budget's bucket, built when the budget is set, starts with their reservations (their
    settlements then correct them to the actual figures, as for any request)."""
    p = await principal_with(db, Limits(), Limits())
    await _spent_900_tokens(db, p, tmp_path)
    store = MemoryStore() if store_kind == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    limits = LimitsSource(db)
    adm = QuotaAdmission(store, limits, PRICES)
    in_flight = [await adm.admit(p, "m", 400) for _ in range(2)]  # no budget yet: admitted
    assert p.tenant_id is not None
    await TenancyService(db).update_limits("tenant", p.tenant_id, token_budget=2000)
    limits.invalidate()
    with pytest.raises(QuotaExceeded, match="token budget"):
        await adm.admit(p, "m", 301)  # 900 recorded + 800 in flight
    late = await adm.admit(p, "m", 300)
    for ticket in in_flight:
        await adm.settle(ticket, 250, 0.0)  # 300 fewer than reserved
    await adm.settle(late, 300, 0.0)
    await adm.admit(p, "m", 300)
    with pytest.raises(QuotaExceeded, match="token budget"):
        await adm.admit(p, "m", 1)


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
@pytest.mark.parametrize("period", ["total", "day"])
async def test_a_spent_lifetime_budget_asks_no_wait(
    db: Database, redis: Redis, redis_prefix: str, tmp_path: Path, store_kind: str, period: str
) -> None:
    """A "total" budget never resets: its refusal has no retry time and says an admin must raise it;
    a budget with a period is refused until the period ends."""
    p = await principal_with(db, Limits(token_budget=1000, budget_period=period), Limits())  # type: ignore[arg-type]
    await _spent_900_tokens(db, p, tmp_path)
    store = MemoryStore() if store_kind == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    adm = QuotaAdmission(store, LimitsSource(db), PRICES)
    with pytest.raises(QuotaExceeded, match="token budget") as refused:
        await adm.admit(p, "m", 200)
    if period == "total":
        assert refused.value.retry_after is None and "admin must raise" in refused.value.message
    else:
        assert refused.value.retry_after is not None and refused.value.retry_after > 0
        assert "admin" not in refused.value.message
