"""``FairQueue``'s memory of tenants: a gateway meets millions of them over months."""

from __future__ import annotations

from engine.fair_queue import FairQueue
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def seq(tenant: str, rid: str = "r") -> Sequence:
    s = Sequence(rid, [1, 2, 3], SamplingParams(max_tokens=4), arrival_time=0.0, max_len=8)
    s.tenant = tenant
    return s


def serve_once(q: FairQueue, s: Sequence, tokens: int) -> None:
    q.push(s)
    assert q.pop() is s
    q.charge(s, tokens)


def test_tenants_served_once_are_forgotten_once_idle() -> None:
    q = FairQueue()
    s = seq("t")
    for i in range(100_000):
        s.tenant = f"t{i}"
        serve_once(q, s, 10)
    assert len(q._shares) <= 200  # was 100,000: one entry per tenant ever seen
    assert len(q) == 0 and list(q) == []


def test_an_idle_tenant_keeps_its_debt_and_a_forgotten_one_starts_as_a_newcomer() -> None:
    q = FairQueue()
    heavy = seq("heavy")
    serve_once(q, heavy, 1_000_000)
    s = seq("t")
    for i in range(10_000):
        s.tenant = f"t{i}"
        serve_once(q, s, 10)
    assert q.virtual_service("heavy") == 1_000_000  # still remembered: above the queue's virtual time
    # a tenant forgotten long ago and one never seen start at the same place, below the heavy one
    old, new = seq("t0", "old"), seq("never-seen", "new")
    q.push(old)
    q.push(new)
    q.push(heavy)
    assert q.virtual_service("t0") == q.virtual_service("never-seen") < q.virtual_service("heavy")
    assert [q.pop().tenant for _ in range(3)][-1] == "heavy"


def test_a_tenant_back_while_nobody_waits_does_not_bank_its_idle_time() -> None:
    q = FairQueue()
    a, b = seq("A", "a"), seq("B", "b")
    serve_once(q, b, 5)
    for _ in range(100):  # A is served while B is idle
        serve_once(q, a, 10)
    for i in range(SWEEP := 200):  # enough newcomers for the queue to sweep
        serve_once(q, seq(f"n{i}"), 2_000)
    q.push(b)
    assert q.virtual_service("B") >= 1_000 - SWEEP  # not 5: B's idle time is no credit against A
