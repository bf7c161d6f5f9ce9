"""Polls (``Reservation.requests_only``: a read or cancel of a stored response) in both quota stores:
counted against requests/min alone, as one request of no tokens; no tokens/min, concurrency or budget
refuses one (a budget bucket the store lost included), and one holds no lease and reserves nothing."""

from __future__ import annotations

import uuid

import pytest

from gateway.quotas.limits import Limits, Scope
from gateway.quotas.store import QuotaStore, Reservation
from tests.gateway.tenancy_fixtures import redis, redis_prefix  # noqa: F401
from tests.gateway.test_quota_store import NOW, key, res, seeded, store  # noqa: F401


def poll(scopes: list[Scope], *, now: float = NOW) -> Reservation:
    return Reservation(uuid.uuid4().hex, now, 0, 0, scopes, requests_only=True)


async def test_polls_count_against_requests_per_minute_with_the_other_requests(store: QuotaStore) -> None:
    scopes = [Scope("key", "k1", Limits(requests_per_minute=3, tokens_per_minute=1000)),
              Scope("tenant", "t1", Limits(requests_per_minute=10))]
    assert (await store.reserve(res(scopes, tokens=100))).admitted
    polled = await store.reserve(poll(scopes))
    assert polled.admitted and polled.requests is not None and polled.requests.remaining == 1
    assert polled.tokens is not None and (polled.tokens.limit, polled.tokens.remaining) == (1000, 900)
    assert (await store.reserve(poll(scopes, now=NOW + 10))).admitted
    over = await store.reserve(poll(scopes, now=NOW + 20))
    assert (over.admitted, over.reason, over.scope_index) == (False, "requests", 0)
    assert over.retry_after == pytest.approx(39.75, abs=0.01)  # when the first second leaves the window
    assert over.requests is not None and (over.requests.limit, over.requests.remaining) == (3, 0)
    assert over.tokens is not None and over.tokens.remaining == 900
    refused = await store.reserve(res(scopes, now=NOW + 20))  # the polls count for the other requests too
    assert (refused.admitted, refused.reason) == (False, "requests")
    assert (await store.reserve(poll(scopes, now=NOW + 60))).admitted


async def test_a_tenants_requests_per_minute_counts_its_keys_polls(store: QuotaStore) -> None:
    tenant = Scope("tenant", "t1", Limits(requests_per_minute=2))
    assert (await store.reserve(poll([Scope("key", "a", Limits()), tenant]))).admitted
    assert (await store.reserve(poll([Scope("key", "b", Limits()), tenant]))).admitted
    over = await store.reserve(poll([Scope("key", "a", Limits()), tenant]))
    assert (over.admitted, over.reason, over.scope_index) == (False, "requests", 1)


async def test_spent_tokens_per_minute_concurrency_and_budgets_do_not_refuse_a_poll(store: QuotaStore) -> None:
    scopes = await seeded(store, [
        Scope("key", "k1", Limits(tokens_per_minute=100, max_concurrency=1)),
        Scope("tenant", "t1", Limits(token_budget=100, cost_budget=0.0001, budget_period="total"))])
    assert (await store.reserve(res(scopes, tokens=100, micros=100))).admitted  # all of each, and its one slot
    refused = await store.reserve(res(scopes, tokens=1))
    assert not refused.admitted and refused.reason == "tokens"
    polled = await store.reserve(poll(scopes))
    assert polled.admitted and polled.tokens is not None and polled.tokens.remaining == 0


async def test_a_poll_of_a_scope_whose_budget_bucket_is_lost_is_admitted_without_making_one(
        store: QuotaStore) -> None:
    """A budget's bucket the store does not hold: a poll is admitted and makes none (a request then
    still has it rebuilt from the usage records first)."""
    scopes = key(token_budget=1000)
    assert (await store.reserve(poll(scopes))).admitted
    assert (await store.reserve(res(scopes))).reason == "unseeded"


async def test_a_poll_reserves_no_tokens_and_holds_no_slot(store: QuotaStore) -> None:
    scopes = await seeded(store, [Scope("key", "k1", Limits(tokens_per_minute=100, max_concurrency=1,
                                                            token_budget=100, cost_budget=0.0001)),
                                  Scope("tenant", "t1", Limits())])
    for i in range(5):
        assert (await store.reserve(poll(scopes, now=NOW + i))).admitted
    whole = await store.reserve(res(scopes, now=NOW + 5, tokens=100, micros=100))  # all of each is still there
    assert whole.admitted and whole.tokens is not None and whole.tokens.remaining == 0
