"""A background response's spend is counted once in its budgets where a budget bucket is rebuilt from
the usage rows while it is metered: after its usage row reached the database and before its charge
(Redis restarted empty, a budget set meanwhile), after its charge (the bucket rebuilt after the row
was settled; Redis restarted empty before it was, the response metered again), and where the row
was not in the database yet when the bucket was rebuilt (another replica's buffer): the rebuild
counts what the rows hold, the charge what they did not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from gateway import held_usage
from gateway.admin.service import TenancyService
from gateway.contracts import Admission, Principal
from gateway.db import Database
from gateway.held_usage import meter_ended, unsettled
from gateway.quotas.admission import QuotaAdmission
from gateway.quotas.limits import Limits, LimitsSource
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import MemoryStore, QuotaStore
from gateway.stored_responses import Kept, ResponseStore
from gateway.usage.writer import UsageWriter
from tests.gateway.tenancy_fixtures import REDIS_URL, db, redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_admission import principal_with
from tests.support.held_meter_child import PRICES, ended, pipeline

BUDGET = Limits(token_budget=1000, budget_period="total")
SPENT = (10, 16 * 10**6)  # 7 + 3 tokens; 7 x 1 + 3 x 3 micro-dollars, in pico-dollars


@dataclass
class Replica:
    """A replica's quota admission and usage writer, on the test's store."""

    admission: QuotaAdmission
    writer: UsageWriter
    store: QuotaStore
    redis: Redis
    redis_prefix: str | None  # None: the memory store

    async def lose_buckets(self, p: Principal, root: str | None = None) -> None:
        """The budget buckets of ``p``'s key (``root``: the first of its rotation chain) and tenant gone
        (Redis restarted empty: its buckets deleted under the test's own prefix, the shared Redis left
        as it is)."""
        buckets = [("key", root or p.key_id, "total"), ("tenant", str(p.tenant_id), "total")]
        await self.store.forget(buckets, [])

    async def spent(self, p: Principal, root: str | None = None) -> list[tuple[int, int]]:
        """What the budget buckets of ``p``'s key (``root``: the first of its rotation chain) and tenant
        hold (tokens, pico-dollars)."""
        out: list[tuple[int, int]] = []
        for kind, sid in (("key", root or p.key_id), ("tenant", str(p.tenant_id))):
            if isinstance(self.store, MemoryStore):
                tokens, picos = self.store._budgets[f"{kind}:{sid}:total"]
            else:
                bucket = f"{self.redis_prefix}:{kind}:{sid}:bd:total"
                raw = await self.redis.hmget(bucket, ["tokens", "micros", "picos"])
                tokens, micros, past = (int(v or 0) for v in raw)
                picos = micros * 10**6 + past
            out.append((tokens, picos))
        return out


@pytest.fixture(params=["redis", "memory"])
async def replica(request: pytest.FixtureRequest, db: Database, redis: Redis,
                  redis_prefix: str, tmp_path: Path) -> AsyncIterator[Replica]:
    client = connect_redis(REDIS_URL) if request.param == "redis" else None
    store: QuotaStore = RedisStore(client, prefix=redis_prefix) if client is not None else MemoryStore()
    writer = UsageWriter(db, PRICES, journal_dir=tmp_path / "journal", flush_interval=3600)
    admission = QuotaAdmission(store, LimitsSource(db), PRICES, flush_records=writer.flush)
    yield Replica(admission, writer, store, redis, redis_prefix if client is not None else None)
    await writer.aclose()
    await admission.aclose()
    if client is not None:
        await client.aclose()


class BeforeCharge:
    """An admission that runs ``then`` before each charge: what happens between a meterer's usage row
    and its charge."""

    def __init__(self, admission: QuotaAdmission, then: Callable[[], Awaitable[None]]) -> None:
        self.admission = admission
        self.then = then

    async def charge(self, principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        await self.then()
        await self.admission.charge(principal, tokens, cost, once=once)


async def _held(db: Database, p: Principal) -> str:
    """A background response ``p`` started, stored held: its id."""
    response_id = f"resp_bg_rebuild_{p.key_id}"
    queued = {"id": response_id, "object": "response", "status": "queued", "model": "m", "created_at": 1}
    pending = unsettled(p, "req-1", "m", "m", "d", "openai", 7, None)
    assert await ResponseStore(db).save(p, Kept(queued, [], [], None, "d", pending), None)
    return response_id


async def _rebuild(admission: QuotaAdmission, p: Principal) -> None:
    """An admission of ``p`` (of nothing): it rebuilds the buckets it finds missing from the usage rows."""
    await admission.settle(await admission.admit(p, "m", 0), 0, 0.0)


@pytest.mark.parametrize("cause", ["buckets lost", "budget set"])
async def test_a_bucket_rebuilt_between_the_usage_row_and_the_charge_counts_the_spend_once(
    db: Database, replica: Replica, cause: str
) -> None:
    """The rebuild counts the row (this replica's writer flushes it first), and the charge that comes
    after it adds nothing to the rebuilt buckets."""
    p = await principal_with(db, BUDGET, BUDGET) if cause == "buckets lost" else \
        await principal_with(db, Limits(), Limits())
    store, response_id = ResponseStore(db), await _held(db, p)
    if cause == "buckets lost":
        await _rebuild(replica.admission, p)  # the budget buckets exist, at 0

    async def rebuilt() -> None:
        if cause == "buckets lost":
            await replica.lose_buckets(p)
        else:
            tenancy = TenancyService(db)
            await tenancy.set_limits("tenant", str(p.tenant_id), BUDGET)
            await tenancy.set_limits("key", p.key_id, BUDGET)
            replica.admission.limits.invalidate()
        await _rebuild(replica.admission, p)

    admission = cast(Admission, BeforeCharge(replica.admission, rebuilt))
    await meter_ended(pipeline(admission, replica.writer), store, response_id, ended(response_id))
    assert await store.claim(response_id, 3600) is None  # settled
    assert await replica.spent(p) == [SPENT, SPENT]


async def test_a_rotated_keys_bucket_rebuilt_before_the_charge_counts_the_spend_once(
    db: Database, replica: Replica
) -> None:
    """The key's scope is its rotation chain: a response started by a key rotated from another is in
    the bucket of the chain's first key, rebuilt from the rows of every key of the chain."""
    first = await principal_with(db, BUDGET, BUDGET)
    rotated = (await TenancyService(db).rotate_key(first.key_id)).key.id
    p = Principal(key_id=rotated, tenant_id=first.tenant_id)
    store, response_id = ResponseStore(db), await _held(db, p)
    await _rebuild(replica.admission, p)

    async def rebuilt() -> None:
        await replica.lose_buckets(p, first.key_id)
        await _rebuild(replica.admission, first)  # the chain's first key: the same buckets

    admission = cast(Admission, BeforeCharge(replica.admission, rebuilt))
    await meter_ended(pipeline(admission, replica.writer), store, response_id, ended(response_id))
    assert await replica.spent(p, first.key_id) == [SPENT, SPENT]


async def test_a_bucket_rebuilt_after_the_response_was_settled_counts_the_spend_once(
    db: Database, replica: Replica
) -> None:
    p = await principal_with(db, BUDGET, BUDGET)
    store, response_id = ResponseStore(db), await _held(db, p)
    await _rebuild(replica.admission, p)
    await meter_ended(pipeline(replica.admission, replica.writer), store, response_id, ended(response_id))
    await replica.lose_buckets(p)
    await _rebuild(replica.admission, p)
    assert await replica.spent(p) == [SPENT, SPENT]


async def test_a_response_metered_again_after_its_charge_and_a_rebuild_is_counted_once(
    db: Database, replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its meterer charged, then died before it settled the row; the store lost its state (Redis
    restarted empty: its once-keys gone too) and the buckets were rebuilt, the row in them; the
    response metered again charges nothing more."""
    p = await principal_with(db, BUDGET, BUDGET)
    store, response_id = ResponseStore(db), await _held(db, p)
    await _rebuild(replica.admission, p)

    class Died(Exception):
        pass

    async def charged_then_died(principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        await replica.admission.charge(principal, tokens, cost, once=once)
        if replica.redis_prefix is not None:
            await replica.redis.delete(f"{replica.redis_prefix}:charged:{once}")
        else:
            cast(MemoryStore, replica.store)._once.clear()
        await replica.lose_buckets(p)
        await _rebuild(replica.admission, p)
        raise Died

    monkeypatch.setattr(held_usage, "LEASE_SECONDS", -1.0)  # its claim is over at once: it died
    dying: Any = type("Dying", (), {"charge": staticmethod(charged_then_died)})()
    with pytest.raises(Died):
        await meter_ended(pipeline(dying, replica.writer), store, response_id, ended(response_id))
    await meter_ended(pipeline(replica.admission, replica.writer), store, response_id, ended(response_id))
    assert await store.claim(response_id, 3600) is None  # settled
    assert await replica.spent(p) == [SPENT, SPENT]


async def test_a_row_not_in_the_database_when_the_bucket_is_rebuilt_is_counted_by_its_charge(
    db: Database, replica: Replica
) -> None:
    """Another replica rebuilds the buckets while the meterer's row is still in its writer's buffer:
    the rebuild does not count it, the charge does."""
    p = await principal_with(db, BUDGET, BUDGET)
    store, response_id = ResponseStore(db), await _held(db, p)
    await _rebuild(replica.admission, p)
    other = QuotaAdmission(replica.store, LimitsSource(db), PRICES)  # its own writer: not this one's rows

    async def rebuilt_elsewhere() -> None:
        await replica.lose_buckets(p)
        await _rebuild(other, p)

    admission = cast(Admission, BeforeCharge(replica.admission, rebuilt_elsewhere))
    try:
        await meter_ended(pipeline(admission, replica.writer), store, response_id, ended(response_id))
    finally:
        await other.aclose()
    assert await replica.writer.flush()
    assert await replica.spent(p) == [SPENT, SPENT]
