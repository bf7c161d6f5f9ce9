"""``MemoryStore`` over months: what a key no longer uses goes, as Redis lets its keys expire."""

from __future__ import annotations

import uuid

from gateway.quotas.limits import Limits, Scope, period_id, period_start
from gateway.quotas.store import ONCE_SECONDS, Lease, MemoryStore, Reservation, lease_for

NOW = 1_800_000_000.25
LIMITS = Limits(requests_per_minute=1, tokens_per_minute=1000, max_concurrency=1)


def scopes(key: str, limits: Limits = LIMITS) -> list[Scope]:
    return [Scope("key", key, limits), Scope("tenant", "t1", Limits())]


async def admit(store: MemoryStore, key: str, now: float, limits: Limits = LIMITS) -> Lease | None:
    r = Reservation(uuid.uuid4().hex, now, 10, 0, scopes(key, limits))
    return lease_for(r) if (await store.reserve(r)).admitted else None


async def churn(store: MemoryStore, start: float, keys: int) -> None:
    """Requests of ``keys`` keys of their own from ``start``, 10 ms apart, each settled."""
    for i in range(keys):
        lease = await admit(store, f"k{i}", start + i * 0.01)
        assert lease is not None
        store.settle(lease, start + i * 0.01, 10, 0)


async def test_keys_gone_idle_leave_the_store() -> None:
    store = MemoryStore()
    for i in range(100_000):
        now = NOW + i * 0.0005  # 50 s of traffic, each request from a key of its own
        lease = await admit(store, f"k{i}", now)
        assert lease is not None
        store.settle(lease, now, 12, 0)
    assert len(store) > 200_000  # each key's windows, within the minute: still counted
    busy = await admit(store, "busy", NOW + 100)  # held, not settled
    assert busy is not None
    recent = await admit(store, "recent", NOW + 150)
    assert recent is not None
    store.settle(recent, NOW + 150, 10, 0)
    assert await admit(store, "other", NOW + 161) is not None  # a minute after the last sweep
    assert len(store) <= 10  # was 300,000 and more: empty windows and lease maps of every key ever seen
    # what is still in use counts as before
    assert await admit(store, "busy", NOW + 162) is None  # its lease
    assert await admit(store, "recent", NOW + 162) is None  # requests/min
    store.settle(busy, NOW + 163, 10, 0)
    assert await admit(store, "busy", NOW + 164) is not None

async def test_a_budget_bucket_goes_a_day_after_its_period() -> None:
    store = MemoryStore()
    day = Limits(token_budget=1000, budget_period="day")
    pid, ttl = period_id("day", NOW)
    await store.seed_budget("key", "b", pid, 900, 0, ttl, NOW, period_start("day", NOW))
    assert await admit(store, "b", NOW, day) is not None
    assert await admit(store, "b", NOW + 1, Limits(token_budget=905, budget_period="day")) is None  # 910 spent
    await churn(store, NOW + 2, 2000)  # enough keys for the store to sweep, within the period
    assert await admit(store, "b", NOW + 100, Limits(token_budget=925, budget_period="day")) is not None
    assert await admit(store, "b", NOW + 101, Limits(token_budget=925, budget_period="day")) is None
    await churn(store, NOW + ttl + 86400 + 1, 2000)
    assert f"key:b:{pid}" not in store._budgets and not store._seeded  # was kept forever, a bucket a day


async def test_a_charges_once_key_goes_after_its_time() -> None:
    """The once-keys of charges go as Redis lets them expire (``ONCE_SECONDS``): the store holds a
    week's at most, and a key gone charges again."""
    store = MemoryStore()
    pid, ttl = period_id("total", NOW)
    await store.seed_budget("key", "c", pid, 0, 0, ttl, NOW, None)
    budget = scopes("c", Limits(token_budget=2000, budget_period="total"))

    def charge(now: float, once: str) -> None:
        lease = lease_for(Reservation(uuid.uuid4().hex, now, 0, 0, budget))
        store.settle(lease, now, 1, 0, given_back=True, once=once)

    for i in range(1000):
        charge(NOW + i, f"bg-{i}")
    charge(NOW + 1000, "bg-0")  # within the week: not again
    assert len(store) == 1000 + 1  # the keys, and the budget bucket
    later = NOW + ONCE_SECONDS + 499.5
    charge(later, "bg-0")  # a week on: its key has gone (and the 499 after it): charged again
    assert len(store) == 501 + 1
    # 1001 tokens charged: a request of 10 finds no room in 1010, and room in 1011
    assert await admit(store, "c", later, Limits(token_budget=1010, budget_period="total")) is None
    assert await admit(store, "c", later, Limits(token_budget=1011, budget_period="total")) is not None
