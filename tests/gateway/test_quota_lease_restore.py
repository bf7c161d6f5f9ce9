"""A live request's concurrency slot survives its lease's expiry: the heartbeat takes it again."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from gateway.contracts import QuotaExceeded
from gateway.db import Database
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import QuotaStore, Reservation, lease_for
from tests.gateway.tenancy_fixtures import REDIS_URL, db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import PRICES, principal_with
from tests.gateway.test_quota_store import NOW, key, res, seeded, store  # noqa: F401
from tests.support.tcp_gate import TcpGate


async def test_a_renewal_takes_back_a_dropped_lease_even_over_the_limit(store: QuotaStore) -> None:
    """A lease dropped by the expiry sweep is held again by its renewal, though another request took
    its slot meanwhile (both run: the count is over the limit until one ends); its settlement then
    releases it once and corrects its reservation once."""
    scopes = await seeded(store, key(max_concurrency=1, token_budget=1000))
    slow = Reservation("slow", NOW, 300, 0, scopes, lease_seconds=5)
    assert (await store.reserve(slow)).admitted
    other = res(scopes, now=NOW + 10, tokens=100)
    assert (await store.reserve(other)).admitted  # drops the expired lease, takes its slot
    await store.renew([lease_for(slow)], NOW + 11, 5)  # the heartbeat, back: takes the slot again
    refused = await store.reserve(res(scopes, now=NOW + 12, tokens=1))
    assert not refused.admitted and refused.reason == "concurrency"
    await store.settle(lease_for(other), NOW + 13, 100, 0)
    assert not (await store.reserve(res(scopes, now=NOW + 13, tokens=1))).admitted  # slow still runs
    await store.settle(lease_for(slow), NOW + 14, 200, 0)  # 300 reserved corrected to 200, once
    last = res(scopes, now=NOW + 15, tokens=700)  # 100 + 200 spent of 1000; the slot free
    assert (await store.reserve(last)).admitted
    refused = await store.reserve(res(scopes, now=NOW + 15, tokens=0))
    assert not refused.admitted and refused.reason == "concurrency"  # one held: last's
    await store.settle(lease_for(last), NOW + 16, 700, 0)
    refused = await store.reserve(res(scopes, now=NOW + 16, tokens=1))
    assert not refused.admitted and refused.reason == "token_budget"  # the slot free, the budget spent


async def test_a_renewal_after_the_bucket_was_rebuilt_without_the_lease_adds_its_reservation(
    store: QuotaStore,
) -> None:
    """A lease gone when the budget bucket was rebuilt (after its admission) is not in the bucket: the
    renewal that takes it back adds its reservation, which its settlement then corrects."""
    scopes = key(token_budget=1000)
    slow = Reservation("slow", NOW, 300, 0, scopes, lease_seconds=5)
    free = key()  # admitted while the scope had no budget (as after a store restart)
    assert (await store.reserve(Reservation("slow", NOW, 300, 0, free, lease_seconds=5))).admitted
    await seeded(store, scopes, now=NOW + 10)  # the lease expired: not counted
    await store.renew([lease_for(slow)], NOW + 11, 5)
    assert not (await store.reserve(res(scopes, now=NOW + 12, tokens=701))).admitted  # 300 held
    await store.settle(lease_for(slow), NOW + 13, 200, 0)
    assert (await store.reserve(res(scopes, now=NOW + 13, tokens=800))).admitted
    assert not (await store.reserve(res(scopes, now=NOW + 13, tokens=1))).admitted


async def test_a_lease_dropped_while_redis_was_unreachable_is_restored(
    db: Database, redis: Redis, redis_prefix: str
) -> None:
    """Replica A's Redis is unreachable past its lease; replica B's admission drops A's lease and
    takes the slot. Once A reaches Redis again its heartbeat takes A's slot back: after B's request
    ends, the limit of 1 still counts A's, until A settles (once)."""
    p = await principal_with(db, Limits(max_concurrency=1), Limits())
    gate = TcpGate("127.0.0.1", 6379)
    port = await gate.start()
    a_client = connect_redis(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    b_client = connect_redis(REDIS_URL)
    a = QuotaAdmission(RedisStore(a_client, prefix=redis_prefix), LimitsSource(db), PRICES, lease_seconds=1.2)
    b = QuotaAdmission(RedisStore(b_client, prefix=redis_prefix), LimitsSource(db), PRICES, lease_seconds=1.2)
    a.start()
    try:
        held = await a.admit(p, "m", 10)
        gate.black_hole()
        await asyncio.sleep(2.0)  # A's lease expires: its renewals fail
        taken = await b.admit(p, "m", 10)  # drops A's lease
        gate.reopen()
        await asyncio.sleep(1.5)  # A's client finds Redis again; its heartbeat renews
        await b.settle(taken, 10, 0.0)
        with pytest.raises(QuotaExceeded, match="concurrent"):
            await b.admit(p, "m", 10)
        await a.settle(held, 10, 0.0)
        await asyncio.sleep(0.1)
        assert await redis.zcard(f"{redis_prefix}:tenant:{p.tenant_id}:cc") == 0
        await b.settle(await b.admit(p, "m", 10), 10, 0.0)
    finally:
        await a.aclose()
        await b.aclose()
        await a_client.aclose()
        await b_client.aclose()
        await gate.aclose()
