"""The quota stores: the Redis Lua scripts and the in-process store behave the same."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.quotas.limits import Limits, Scope, period_id, period_start
from gateway.quotas.redis_store import RedisStore, connect_redis
from gateway.quotas.store import Lease, MemoryStore, QuotaStore, Reservation, lease_for
from tests.gateway.tenancy_fixtures import REDIS_URL, redis, redis_prefix  # noqa: F401

NOW = 1_800_000_000.25


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis: Redis, redis_prefix: str) -> AsyncIterator[QuotaStore]:
    yield MemoryStore() if request.param == "memory" else RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)


def res(scopes: list[Scope], *, now: float = NOW, tokens: int = 10, micros: int = 0) -> Reservation:
    return Reservation(uuid.uuid4().hex, now, tokens, micros, scopes)


async def seeded(store: QuotaStore, scopes: list[Scope], *, now: float = NOW, tokens: int = 0) -> list[Scope]:
    """Create the budget buckets (what admission does from the usage records for a new bucket)."""
    for s in scopes:
        pid, ttl = period_id(s.limits.budget_period, now)
        await store.seed_budget(s.kind, s.id, pid, tokens, 0, ttl, now, period_start(s.limits.budget_period, now))
    return scopes


def key(**limits: object) -> list[Scope]:
    return [Scope("key", "k1", Limits(**limits)), Scope("tenant", "t1", Limits())]  # type: ignore[arg-type]


async def test_requests_per_minute_sliding_window(store: QuotaStore) -> None:
    scopes = key(requests_per_minute=3)
    states = [await store.reserve(res(scopes)) for _ in range(3)]
    assert all(d.admitted for d in states)
    assert [d.requests.remaining for d in states if d.requests] == [2, 1, 0]
    assert states[0].requests and states[0].requests.limit == 3
    over = await store.reserve(res(scopes, now=NOW + 30))
    assert not over.admitted and over.reason == "requests"
    assert over.retry_after == pytest.approx(29.75, abs=0.01)  # when the first second leaves the window
    later = await store.reserve(res(scopes, now=NOW + 60))
    assert later.admitted


async def test_a_requests_refusal_after_a_lowered_limit_retries_when_enough_requests_have_left(
        store: QuotaStore) -> None:
    """A requests/min limit lowered below what the window holds: Retry-After is when enough
    seconds have left it to admit a request, not when the oldest leaves (its 2 requests would still
    leave 8, over the new limit of 5)."""
    before = key(requests_per_minute=10)
    for i in range(10):
        assert (await store.reserve(res(before, now=NOW if i < 2 else NOW + 30))).admitted
    lowered = key(requests_per_minute=5)
    over = await store.reserve(res(lowered, now=NOW + 31))
    assert not over.admitted and over.reason == "requests"
    assert over.retry_after == pytest.approx(58.75, abs=0.01)  # when the second of the 8 leaves
    assert not (await store.reserve(res(lowered, now=NOW + 61))).admitted
    assert (await store.reserve(res(lowered, now=NOW + 31 + over.retry_after))).admitted


async def test_a_refusal_for_requests_reports_the_tokens_left(store: QuotaStore) -> None:
    """A request refused for requests/min still reports tokens/min (OpenAI's clients read both sets of
    headers): the tightest of every scope's, the refusing one's and those after it included, as they
    stand (the refused request reserved nothing)."""
    scopes = [Scope("key", "k1", Limits(requests_per_minute=1, tokens_per_minute=1000)),
              Scope("tenant", "t1", Limits(tokens_per_minute=500))]
    assert (await store.reserve(res(scopes, tokens=100))).admitted
    over = await store.reserve(res(scopes, now=NOW + 10, tokens=100))
    assert not over.admitted and over.reason == "requests" and over.scope_index == 0
    assert over.tokens is not None and (over.tokens.limit, over.tokens.remaining) == (500, 400)
    assert over.tokens.reset_seconds == pytest.approx(49.75, abs=0.002)
    alone = [Scope("key", "k2", Limits(requests_per_minute=1, tokens_per_minute=1000)), Scope("tenant", "t2", Limits())]
    assert (await store.reserve(res(alone, tokens=100))).admitted
    over = await store.reserve(res(alone, tokens=100))
    assert over.tokens is not None and (over.tokens.limit, over.tokens.remaining) == (1000, 900)


REFUSING: dict[str, dict[str, Any]] = {
    "tokens": {"tokens_per_minute": 150},
    "concurrency": {"max_concurrency": 1},
    "token_budget": {"token_budget": 150},
    "cost_budget": {"cost_budget": 0.00015},  # 150 micro-dollars
}


@pytest.mark.parametrize("where", [0, 1], ids=["key", "tenant"])
@pytest.mark.parametrize("reason", list(REFUSING))
async def test_every_refusal_reports_requests_and_tokens_as_they_stand(
    store: QuotaStore, reason: str, where: int
) -> None:
    """Whatever refuses a request (a rate, concurrency, a budget; at the key or at its tenant), the
    refusal reports both requests/min and tokens/min: the tightest of every scope's, as they stand
    (the refused request reserved nothing)."""
    limits: list[dict[str, Any]] = [{"requests_per_minute": 10, "tokens_per_minute": 1000},
                                    {"requests_per_minute": 4, "tokens_per_minute": 2000}]
    limits[where] |= REFUSING[reason]
    scopes = await seeded(store, [Scope("key", "k1", Limits(**limits[0])), Scope("tenant", "t1", Limits(**limits[1]))])
    assert (await store.reserve(res(scopes, tokens=100, micros=100))).admitted
    over = await store.reserve(res(scopes, now=NOW + 10, tokens=100, micros=100))
    assert (over.admitted, over.reason, over.scope_index) == (False, reason, where)
    assert over.requests is not None and (over.requests.limit, over.requests.remaining) == (4, 3)
    assert over.requests.reset_seconds == pytest.approx(49.75, abs=0.002)
    tokens = (150, 50) if reason == "tokens" else (1000, 900)
    assert over.tokens is not None and (over.tokens.limit, over.tokens.remaining) == tokens
    assert over.tokens.reset_seconds == pytest.approx(49.75, abs=0.002)


async def test_a_refusal_reports_no_state_of_a_limit_no_scope_has(store: QuotaStore) -> None:
    scopes = key(max_concurrency=1)
    assert (await store.reserve(res(scopes))).admitted
    over = await store.reserve(res(scopes))
    assert over.reason == "concurrency" and over.requests is None and over.tokens is None


async def test_concurrent_admissions_are_exact(store: QuotaStore) -> None:
    scopes = key(requests_per_minute=100)
    decisions = await asyncio.gather(*(store.reserve(res(scopes)) for _ in range(300)))
    assert sum(d.admitted for d in decisions) == 100


async def test_tenant_limit_covers_all_its_keys(store: QuotaStore) -> None:
    tenant = Scope("tenant", "t1", Limits(requests_per_minute=2))
    a = [Scope("key", "a", Limits()), tenant]
    b = [Scope("key", "b", Limits()), tenant]
    assert (await store.reserve(res(a))).admitted
    assert (await store.reserve(res(b))).admitted
    d = await store.reserve(res(a))
    assert not d.admitted and d.reason == "requests" and d.scope_index == 1


async def test_rejection_reserves_nothing(store: QuotaStore) -> None:
    tenant = Scope("tenant", "t1", Limits(requests_per_minute=1))
    scopes = [Scope("key", "a", Limits(requests_per_minute=5)), tenant]
    assert (await store.reserve(res(scopes))).admitted
    assert not (await store.reserve(res(scopes))).admitted
    # the key's own window counted only the admitted request
    alone = [Scope("key", "a", Limits(requests_per_minute=2))]
    assert (await store.reserve(res(alone))).admitted
    assert not (await store.reserve(res(alone))).admitted


async def test_tokens_per_minute_reserve_then_settle(store: QuotaStore) -> None:
    scopes = key(tokens_per_minute=100)
    first = res(scopes, tokens=80)
    d = await store.reserve(first)
    assert d.admitted and d.tokens and d.tokens.remaining == 20
    assert not (await store.reserve(res(scopes, tokens=30))).admitted
    await store.settle(lease_for(first), NOW, 10, 0)  # actually used only 10
    d = await store.reserve(res(scopes, tokens=90))
    assert d.admitted and d.tokens and d.tokens.remaining == 0


async def test_a_tokens_refusal_retries_when_enough_tokens_have_left_the_window(store: QuotaStore) -> None:
    """Retry-After of a tokens/min refusal is when the seconds that leave the window free what the
    request needs, not when the oldest leaves (its 50 tokens would not make room for 200)."""
    scopes = key(tokens_per_minute=1000)
    assert (await store.reserve(res(scopes, tokens=50))).admitted
    assert (await store.reserve(res(scopes, now=NOW + 10, tokens=850))).admitted
    over = await store.reserve(res(scopes, now=NOW + 20, tokens=200))
    assert not over.admitted and over.reason == "tokens"
    assert over.retry_after == pytest.approx(49.75, abs=0.01)  # when the second of the 850 leaves
    assert not (await store.reserve(res(scopes, now=NOW + 60, tokens=200))).admitted
    assert (await store.reserve(res(scopes, now=NOW + 70, tokens=200))).admitted


async def test_concurrency_lease_released_on_settle(store: QuotaStore) -> None:
    scopes = key(max_concurrency=2)
    one, two = res(scopes), res(scopes)
    assert (await store.reserve(one)).admitted
    assert (await store.reserve(two)).admitted
    third = await store.reserve(res(scopes))
    assert not third.admitted and third.reason == "concurrency"
    await store.settle(lease_for(one), NOW, 10, 0)
    assert (await store.reserve(res(scopes))).admitted


async def test_concurrency_lease_expires(store: QuotaStore) -> None:
    scopes = key(max_concurrency=1)
    r = Reservation("x", NOW, 1, 0, scopes, lease_seconds=5)
    assert (await store.reserve(r)).admitted
    assert not (await store.reserve(res(scopes, now=NOW + 4))).admitted
    assert (await store.reserve(res(scopes, now=NOW + 6))).admitted


@pytest.mark.parametrize("period", ["day", "month", "total"])
async def test_token_budget_never_overspent(store: QuotaStore, period: str) -> None:
    scopes = await seeded(store, key(token_budget=1000, budget_period=period))
    rs = [res(scopes, tokens=300) for _ in range(10)]
    decisions = await asyncio.gather(*(store.reserve(r) for r in rs))
    admitted = [r for r, d in zip(rs, decisions) if d.admitted]
    assert len(admitted) == 3
    assert {d.reason for d in decisions if not d.admitted} == {"token_budget"}
    for r in admitted:
        await store.settle(lease_for(r), NOW, 100, 0)  # 300 spent of 1000
    decisions = await asyncio.gather(*(store.reserve(res(scopes, tokens=300)) for _ in range(5)))
    assert sum(d.admitted for d in decisions) == 2


async def test_cost_budget(store: QuotaStore) -> None:
    scopes = await seeded(store, key(cost_budget=0.01))  # 10_000 micro-dollars
    ok = res(scopes, micros=6_000)
    assert (await store.reserve(ok)).admitted
    d = await store.reserve(res(scopes, micros=6_000))
    assert not d.admitted and d.reason == "cost_budget" and d.retry_after > 0
    await store.settle(lease_for(ok), NOW, 10, 1_000)
    assert (await store.reserve(res(scopes, micros=6_000))).admitted


async def test_day_budget_resets_next_day(store: QuotaStore) -> None:
    scopes = await seeded(store, key(token_budget=10, budget_period="day"))
    assert (await store.reserve(res(scopes, tokens=10))).admitted
    assert not (await store.reserve(res(scopes, tokens=1))).admitted
    tomorrow = await store.reserve(res(scopes, tokens=10, now=NOW + 86400))
    assert not tomorrow.admitted and tomorrow.reason == "unseeded"  # a new period's bucket is rebuilt first
    await seeded(store, scopes, now=NOW + 86400)
    assert (await store.reserve(res(scopes, tokens=10, now=NOW + 86400))).admitted


async def test_a_lost_budget_bucket_is_refused_until_rebuilt(store: QuotaStore) -> None:
    scopes = key(token_budget=1000)
    d = await store.reserve(res(scopes))
    assert not d.admitted and d.reason == "unseeded" and d.scope_index == 0
    await seeded(store, scopes, tokens=995)
    assert not (await store.reserve(res(scopes, tokens=10))).admitted
    assert (await store.reserve(res(scopes, tokens=5))).admitted


async def test_a_bucket_built_while_leases_run_starts_with_their_reservations_of_the_period(
    store: QuotaStore,
) -> None:
    """A budget set while the scope's requests run: the bucket holds the records' figures and the
    reservations of the leases in flight made in the period; not those of a past period (their
    settlements correct that period's bucket) nor of leases that ended (theirs add the actual figures)."""
    free, budget = key(), key(token_budget=1000, budget_period="day")
    for r in (Reservation("yesterday", NOW - 86400, 50, 0, free, lease_seconds=2 * 86400),
              Reservation("ended", NOW - 30, 70, 0, free, lease_seconds=10),
              Reservation("live", NOW - 5, 400, 0, free)):
        assert (await store.reserve(r)).admitted
    assert (await store.reserve(res(budget))).reason == "unseeded"
    await seeded(store, budget, tokens=100)
    assert (await store.reserve(res(budget, tokens=501))).reason == "token_budget"
    assert (await store.reserve(res(budget, tokens=500))).admitted


async def test_renewed_lease_outlives_its_first_term(store: QuotaStore) -> None:
    scopes = key(max_concurrency=1)
    r = Reservation("held", NOW, 1, 0, scopes, lease_seconds=5)
    assert (await store.reserve(r)).admitted
    await store.renew([lease_for(r)], NOW + 4, 5)  # the heartbeat of the live replica
    assert not (await store.reserve(res(scopes, now=NOW + 8))).admitted
    assert (await store.reserve(res(scopes, now=NOW + 9.5))).admitted  # not renewed again: expired


async def test_settle_of_a_lease_the_store_lost_adds_the_actual_figures(store: QuotaStore) -> None:
    scopes = await seeded(store, key(token_budget=1000))
    r = res(scopes, tokens=300)
    # admitted by a store that has since lost its state (its bucket was rebuilt after)
    ghost = Reservation("ghost", NOW - 5, 300, 0, scopes)
    assert (await store.reserve(r)).admitted
    await store.settle(lease_for(r), NOW, 100, 0)  # known: 300 reserved corrected to 100
    await store.settle(lease_for(ghost), NOW, 200, 0)  # unknown: its 200 are added
    assert (await store.reserve(res(scopes, tokens=700))).admitted
    assert not (await store.reserve(res(scopes, tokens=1))).admitted


async def test_redis_windows_decide_as_the_memory_store_does_over_a_random_history(
    redis: Redis, redis_prefix: str
) -> None:
    """The Redis windows keep a running sum and their oldest second instead of adding up every
    second on each admission: over a random history (steps of seconds, a minute, hours; a clock a
    second behind; settlements that correct the tokens) every decision and every header figure
    matches the in-process store's, and every key the scripts write has a TTL."""
    rng = random.Random(23)
    memory, remote = MemoryStore(), RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    scopes = [Scope("key", "k1", Limits(requests_per_minute=30, tokens_per_minute=4000)),
              Scope("tenant", "t1", Limits(tokens_per_minute=3000))]
    now, held = NOW, list[Lease]()
    for i in range(1500):
        step = rng.random()
        now += 7200 if step < 0.003 else 61 if step < 0.03 else rng.choice([0, 0, 0, 0.1, 0.2, 0.5, 1, 2])
        at = now - 1 if rng.random() < 0.05 else now  # a replica whose clock is a second behind
        if held and rng.random() < 0.4:
            lease = held.pop(rng.randrange(len(held)))
            actual = rng.randrange(0, 2 * lease.tokens + 1)
            await memory.settle(lease, at, actual, 0)
            await remote.settle(lease, at, actual, 0)
            continue
        r = res(scopes, now=at, tokens=rng.randrange(1, 300))
        got, want = await remote.reserve(r), await memory.reserve(r)
        assert (got.admitted, got.reason, got.scope_index) == (want.admitted, want.reason, want.scope_index)
        for mine, theirs in ((got.requests, want.requests), (got.tokens, want.tokens)):
            assert (mine is None) == (theirs is None)
            if mine and theirs:
                assert (mine.limit, mine.remaining) == (theirs.limit, theirs.remaining)
                assert mine.reset_seconds == pytest.approx(theirs.reset_seconds, abs=0.002)
        if got.admitted:
            held.append(lease_for(r))
        if i % 10 == 0:  # the scripts refresh TTLs once a second: still, no key is ever left without one
            keys = [k async for k in redis.scan_iter(match=f"{redis_prefix}*")]
            assert keys and all([await redis.ttl(k) > 0 for k in keys]), {k: await redis.ttl(k) for k in keys}
            for window in [k for k in keys if k.endswith(b":win")]:
                assert_window_totals(await redis.hgetall(window))
                assert await redis.object("encoding", window) == b"hashtable"  # fields found in O(1)


def assert_window_totals(fields: dict[Any, Any]) -> None:
    """A window hash's running totals are the sums of its seconds' counters, and ``lo`` the oldest
    second held (the same seconds for requests and tokens; its field's name is padded past 64 bytes,
    so that Redis keeps the hash as a hash table)."""
    seconds = {kind: {int(f[1:]): int(v) for f, v in fields.items() if f[:1] == kind and f[1:].isdigit()}
               for kind in (b"r", b"t")}
    assert seconds[b"r"].keys() == seconds[b"t"].keys()
    assert int(fields[b"rs"]) == sum(seconds[b"r"].values())
    assert int(fields[b"ts"]) == sum(seconds[b"t"].values())
    assert int(fields[b"lo" + b"#" * 64]) == min(seconds[b"r"])


async def test_a_tickets_key_emptied_and_made_again_within_a_second_keeps_a_ttl(
    redis: Redis, redis_prefix: str
) -> None:
    """TTLs are refreshed by a scope's first admission of each second; a tickets' key that the last
    settlement emptied (Redis deletes it) and the next admission of that second creates again gets one."""
    store = RedisStore(connect_redis(REDIS_URL), prefix=redis_prefix)
    scopes = key(max_concurrency=5)
    first = res(scopes)
    assert (await store.reserve(first)).admitted
    await store.settle(lease_for(first), NOW, 10, 0)
    assert not [k async for k in redis.scan_iter(match=f"{redis_prefix}*:cc")]
    assert (await store.reserve(res(scopes, now=NOW + 0.1))).admitted  # the same second
    tickets = [k async for k in redis.scan_iter(match=f"{redis_prefix}*:cc")]
    assert len(tickets) == 2 and all([await redis.ttl(k) > 0 for k in tickets])
    # members past 64 bytes: the sets are skiplists (ZADD O(log n)), not listpacks scanned per ZADD
    assert [await redis.object("encoding", k) for k in tickets] == [b"skiplist", b"skiplist"]


async def test_settle_of_a_lease_that_expired_corrects_its_reservation(store: QuotaStore) -> None:
    """A live request whose lease ran out (its replica could not renew it: Redis unreachable for a
    while) and was dropped by a later admission is still counted in the budget and the window it
    was admitted in: its settlement corrects the reservation, not adds the actual figures to it."""
    scopes = await seeded(store, key(token_budget=1000, tokens_per_minute=1000))
    r = Reservation("slow", NOW, 300, 0, scopes, lease_seconds=5)
    assert (await store.reserve(r)).admitted
    assert (await store.reserve(res(scopes, now=NOW + 10, tokens=1))).admitted  # drops the expired lease
    await store.settle(lease_for(r), NOW + 20, 100, 0)  # 300 reserved corrected to 100, not 100 added
    assert (await store.reserve(res(scopes, now=NOW + 20, tokens=899))).admitted
    assert not (await store.reserve(res(scopes, now=NOW + 20, tokens=1))).admitted


async def test_a_charge_made_again_under_its_once_key_adds_nothing(store: QuotaStore) -> None:
    """A charge (a settlement of a reservation never made, as ``QuotaAdmission.charge`` sends) under
    a once-key adds its figures the first time only: a background response metered again after its
    meterer died charges its budgets once. Another key adds its own."""
    scopes = await seeded(store, key(token_budget=1000))

    async def charge(tokens: int, once: str) -> None:
        await store.settle(lease_for(res(scopes, tokens=0)), NOW, tokens, 0, given_back=True, once=once)

    await charge(300, "bg-a")
    await charge(300, "bg-a")  # metered again: already charged
    await charge(200, "bg-b")
    assert (await store.reserve(res(scopes, tokens=500))).admitted  # 300 + 200 + 500
    assert not (await store.reserve(res(scopes, tokens=1))).admitted


async def test_a_bucket_rebuilt_holding_a_charge_to_come_is_not_charged_by_it(store: QuotaStore) -> None:
    """A bucket rebuilt from usage records that hold a charge not made yet (``seed_budget``'s
    ``counted``) adds nothing when that charge comes; a bucket rebuilt without it (the tenant's
    here) is charged; a charge made before the rebuild is noted nowhere (the records holding it, a
    charge under its key adds nothing anyway)."""
    scopes = [Scope("key", "k1", Limits(token_budget=1000)), Scope("tenant", "t1", Limits(token_budget=1000))]
    charge_lease = lease_for(res(scopes, tokens=0))
    await store.settle(charge_lease, NOW, 50, 0, given_back=True, once="bg-before")  # no bucket yet: noted only
    for s, counted in ((scopes[0], ["bg-to-come", "bg-before"]), (scopes[1], [])):
        pid, ttl = period_id(s.limits.budget_period, NOW)
        await store.seed_budget(s.kind, s.id, pid, 300, 0, ttl, NOW, period_start(s.limits.budget_period, NOW),
                                counted=counted)
    await store.settle(charge_lease, NOW, 300, 0, given_back=True, once="bg-to-come")
    await store.settle(charge_lease, NOW, 300, 0, given_back=True, once="bg-to-come")  # sent again
    assert (await store.reserve(res(scopes[:1], tokens=700))).admitted  # the key's: 300, counted once
    assert not (await store.reserve(res(scopes[1:], tokens=401))).admitted  # the tenant's: 300 + 300
    assert (await store.reserve(res(scopes[1:], tokens=400))).admitted
    await store.settle(charge_lease, NOW, 10, 0, given_back=True, once="bg-later")  # another: charged
    assert not (await store.reserve(res(scopes[:1], tokens=1))).admitted
