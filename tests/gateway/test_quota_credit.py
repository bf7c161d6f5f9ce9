"""Admission credit (gateway/quotas/credit.py) on a real Redis: a busy key is admitted in process
while its credit lasts, Redis counts exactly what was used once the credit is handed back, and
replicas together never admit past a limit."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import pytest
from redis.asyncio import Redis

from gateway.admin.service import TenancyService
from gateway.contracts import Principal, QuotaExceeded, Ticket
from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.credit import LocalLease
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_credit import RedisCredit
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import Lease
from tests.gateway.tenancy_fixtures import REDIS_URL, db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import PRICES, principal_with

pytestmark = pytest.mark.parametrize("db", ["sqlite"], indirect=True)

LO = "lo" + "#" * 64


class Clock:
    """Wall-clock time that moves only when the test moves it (a second starts at ``at(0)``)."""

    def __init__(self) -> None:
        self.start = math.floor(time.time())
        self.now = self.start + 0.1

    def __call__(self) -> float:
        return self.now

    def at(self, second: int, fraction: float = 0.1) -> None:
        self.now = self.start + second + fraction


def admission(prefix: str, db: Database, clock: Clock, *, lease_seconds: float = 30.0) -> QuotaAdmission:
    store = RedisStore(connect_redis(REDIS_URL), prefix=prefix)
    return QuotaAdmission(store, LimitsSource(db), PRICES, credit=RedisCredit(store), clock=clock,
                          lease_seconds=lease_seconds)


async def acknowledged(adm: QuotaAdmission) -> None:
    assert adm.credit is not None
    if adm.credit._sent:
        await asyncio.wait(list(adm.credit._sent), timeout=5)


async def window(redis: Redis, prefix: str, p: Principal, second: int) -> tuple[int, int, int, int]:
    """The key's window: requests and tokens counted in ``second``, and the window's totals."""
    values = await redis.hmget(f"{prefix}:key:{p.key_id}:win", [f"r{second}", f"t{second}", "rs", "ts"])
    return tuple(int(v or 0) for v in values)  # type: ignore[return-value]


async def test_a_busy_key_is_admitted_on_credit_and_counted_exactly(db: Database, redis: Redis,
                                                                    redis_prefix: str) -> None:
    p = await principal_with(db, Limits(token_budget=10**9, budget_period="total"),
                             Limits(requests_per_minute=100_000, tokens_per_minute=10**7, max_concurrency=1_000,
                                    token_budget=10**9, budget_period="total"))
    clock = Clock()
    adm = admission(redis_prefix, db, clock)
    assert adm.credit is not None
    s = clock.start
    before = [await adm.admit(p, "m", 100) for _ in range(30)]  # second 0
    assert isinstance(before[0].reservation, Lease)  # counted in Redis one by one
    assert isinstance(before[-1].reservation, LocalLease)  # after 20, credit for as many again was asked for
    for t in before[:10]:
        await adm.settle(t, 40, 0.0)
    in_store = sum(isinstance(t.reservation, Lease) for t in before[10:])
    clock.at(1, 0.01)
    await adm.credit.tick()  # credit for second 1: half again second 0's 30 requests and 3,000 tokens
    assert await window(redis, redis_prefix, p, s + 1) == (45, 4_500, 75, 2_400 + 4_500)
    cc = f"{redis_prefix}:key:{p.key_id}:cc"
    assert await redis.zcard(cc) == in_store + 40  # tickets in Redis, slots for 30 in flight and a quarter more

    clock.at(1, 0.5)
    on_credit: list[Ticket] = [await adm.admit(p, "m", 100) for _ in range(10)]
    assert all(isinstance(t.reservation, LocalLease) for t in on_credit)
    assert await window(redis, redis_prefix, p, s + 1) == (45, 4_500, 75, 6_900)  # no round trip
    remaining = [t.requests.remaining for t in on_credit if t.requests is not None]
    assert remaining == [100_000 - 30 - n for n in range(1, 11)]
    for t in on_credit[:5]:
        await adm.settle(t, 30, 0.0)

    clock.at(2, 0.01)
    await adm.credit.tick()  # 10 requests in second 1: no credit; the unused 35 and the corrections go back
    await acknowledged(adm)
    assert await window(redis, redis_prefix, p, s + 1) == (10, 1_000 - 5 * 70, 40, 2_400 + 650)
    budget = await redis.hmget(f"{redis_prefix}:key:{p.key_id}:bd:total", ["tokens"])
    tenant_budget = await redis.hmget(f"{redis_prefix}:tenant:{p.tenant_id}:bd:total", ["tokens"])
    assert int(budget[0]) == int(tenant_budget[0]) == 2_400 + 650
    assert await redis.zcard(cc) == 20 + 5  # the 25 in flight: tickets and slots; the free slots let go

    for t in before[10:] + on_credit[5:]:
        await adm.settle(t, 100, 0.0)
    await adm.aclose()
    await acknowledged(adm)
    assert await redis.zcard(f"{redis_prefix}:key:{p.key_id}:cc") == 0
    assert await redis.zcard(f"{redis_prefix}:tenant:{p.tenant_id}:cc") == 0
    budget = await redis.hmget(f"{redis_prefix}:key:{p.key_id}:bd:total", ["tokens"])
    assert int(budget[0]) == 2_400 + 650  # the rest used what it reserved: nothing to correct


async def test_replicas_on_credit_never_admit_past_a_limit(db: Database, redis: Redis, redis_prefix: str) -> None:
    p = await principal_with(db, Limits(), Limits(requests_per_minute=1_600))  # a grant may take 100 at most
    clock = Clock()
    a, b = admission(redis_prefix, db, clock), admission(redis_prefix, db, clock)
    assert a.credit is not None and b.credit is not None
    admitted = {"a": 0, "b": 0}
    for second in range(4):  # each second: both replicas admit until refused
        clock.at(second, 0.01)
        await asyncio.gather(a.credit.tick(), b.credit.tick())
        clock.at(second, 0.3)
        for name, adm in (("a", a), ("b", b)):
            with contextlib.suppress(QuotaExceeded):
                for _ in range(40 if second == 0 else 2_000):
                    await adm.admit(p, "m", 1)
                    admitted[name] += 1
            assert admitted["a"] + admitted["b"] <= 1_600
    clock.at(4, 0.01)
    await asyncio.gather(a.credit.tick(), b.credit.tick())  # what was not used goes back
    await acknowledged(a)
    await acknowledged(b)
    total = admitted["a"] + admitted["b"]
    assert (await window(redis, redis_prefix, p, clock.start))[2] == total  # Redis counted exactly these
    assert total >= 1_600 - 100  # short at most by what one grant may take
    await a.aclose()
    await b.aclose()


async def test_credit_is_cut_to_what_is_left_and_a_slow_key_gets_none(db: Database, redis: Redis,
                                                                      redis_prefix: str) -> None:
    near = await principal_with(db, Limits(), Limits(requests_per_minute=40, max_concurrency=64))
    slow = await principal_with(db, Limits(), Limits(requests_per_minute=100_000))
    clock = Clock()
    adm = admission(redis_prefix, db, clock)
    assert adm.credit is not None
    admitted: list[Ticket] = []
    with pytest.raises(QuotaExceeded, match="requests per minute"):
        while True:  # none settles: in flight to the end
            admitted.append(await adm.admit(near, "m", 1))
    assert len(admitted) == 40  # all of the limit, and no more
    assert any(isinstance(t.reservation, LocalLease) for t in admitted)  # some of it on credit: 2 at a time
    bundle = adm.credit._bundles[(near.key_id, near.tenant_id)]
    assert 0 < len(bundle.pool) <= 64 // 16
    for _ in range(19):
        await adm.admit(slow, "m", 1)
    clock.at(1, 0.01)
    await adm.credit.tick()
    await acknowledged(adm)
    assert (await window(redis, redis_prefix, near, clock.start))[2] == 40
    clock.at(1, 0.5)
    assert isinstance((await adm.admit(slow, "m", 1)).reservation, Lease)  # 19 a second: no credit
    await adm.aclose()


async def test_the_slots_of_a_replica_that_died_run_out(db: Database, redis: Redis, redis_prefix: str) -> None:
    p = await principal_with(db, Limits(), Limits(max_concurrency=1_000))
    clock = Clock()
    dead = admission(redis_prefix, db, clock, lease_seconds=1.0)
    assert dead.credit is not None
    for t in [await dead.admit(p, "m", 1) for _ in range(20)]:
        await dead.settle(t, 1, 0.0)
    clock.at(1, 0.01)
    await dead.credit.tick()
    slots = len(dead.credit._bundles[(p.key_id, p.tenant_id)].pool)
    assert slots > 20 and await redis.zcard(f"{redis_prefix}:key:{p.key_id}:cc") == slots  # never let go
    clock.at(2, 0.5)  # past the slots' one-second lease: the next admission in Redis drops them
    other = admission(redis_prefix, db, clock)
    await other.admit(p, "m", 1)
    assert await redis.zcard(f"{redis_prefix}:key:{p.key_id}:cc") == 1
    await other.aclose()


async def test_two_keys_of_a_tenant_hold_slots_of_their_own(db: Database, redis: Redis, redis_prefix: str) -> None:
    first = await principal_with(db, Limits(max_concurrency=10_000), Limits())
    second = Principal(key_id=(await TenancyService(db).create_key(first.tenant_id or "")).key.id,
                       tenant_id=first.tenant_id)
    clock = Clock()
    adm = admission(redis_prefix, db, clock)
    assert adm.credit is not None
    for who in (first, second):
        for t in [await adm.admit(who, "m", 1) for _ in range(20)]:
            await adm.settle(t, 1, 0.0)
    clock.at(1, 0.01)
    await adm.credit.tick()
    pools = [len(b.pool) for b in adm.credit._bundles.values()]
    assert len(pools) == 2 and min(pools) > 0
    assert await redis.zcard(f"{redis_prefix}:tenant:{first.tenant_id}:cc") == sum(pools)
    await adm.aclose()
    await acknowledged(adm)
    assert await redis.zcard(f"{redis_prefix}:tenant:{first.tenant_id}:cc") == 0


async def test_a_lowered_concurrency_limit_shrinks_the_pool(db: Database, redis: Redis, redis_prefix: str) -> None:
    p = await principal_with(db, Limits(), Limits(max_concurrency=320))  # a pool of 20 slots at most
    clock = Clock()
    adm = admission(redis_prefix, db, clock)
    assert adm.credit is not None
    busy = [await adm.admit(p, "m", 1) for _ in range(30)]  # 30 in flight at once
    for t in busy:
        await adm.settle(t, 1, 0.0)
    clock.at(1, 0.01)
    await adm.credit.tick()
    assert len(adm.credit._bundles[(p.key_id, p.tenant_id)].pool) == 20
    await TenancyService(db).set_limits("key", p.key_id, Limits(max_concurrency=4))
    adm.limits.invalidate()
    for second in (1, 2, 3):  # the key stays busy: at most 4 in flight, whichever way admitted
        clock.at(second, 0.5)
        held: list[Ticket] = []
        with contextlib.suppress(QuotaExceeded):
            for _ in range(30):
                held.append(await adm.admit(p, "m", 1))
        assert len(held) <= 4
        for t in held:
            await adm.settle(t, 1, 0.0)
        for _ in range(20):  # busy enough for credit
            with contextlib.suppress(QuotaExceeded):
                await adm.settle(await adm.admit(p, "m", 1), 1, 0.0)
        clock.at(second + 1, 0.01)
        await adm.credit.tick()
        await acknowledged(adm)
    assert await redis.zcard(f"{redis_prefix}:key:{p.key_id}:cc") <= 4
    await adm.aclose()


async def test_credit_granted_under_a_limit_since_lowered_admits_nothing(db: Database, redis: Redis,
                                                                       redis_prefix: str) -> None:
    p = await principal_with(db, Limits(), Limits(requests_per_minute=1_600))
    clock = Clock()
    adm = admission(redis_prefix, db, clock)
    assert adm.credit is not None
    for t in [await adm.admit(p, "m", 1) for _ in range(30)]:
        await adm.settle(t, 1, 0.0)
    clock.at(1, 0.01)
    await adm.credit.tick()  # credit for 45 requests in second 1
    await TenancyService(db).set_limits("key", p.key_id, Limits(requests_per_minute=40))
    adm.limits.invalidate()
    clock.at(1, 0.5)
    with pytest.raises(QuotaExceeded, match="requests per minute"):
        await adm.admit(p, "m", 1)  # 30 in the window and 45 on credit: over 40 already
    await TenancyService(db).set_limits("key", p.key_id, Limits(requests_per_minute=1_600))
    adm.limits.invalidate()
    clock.at(2, 0.01)
    await adm.credit.tick()  # the credit not used goes back: the window holds the 30 admitted
    await acknowledged(adm)
    assert (await window(redis, redis_prefix, p, clock.start))[2] == 30
    await adm.aclose()
