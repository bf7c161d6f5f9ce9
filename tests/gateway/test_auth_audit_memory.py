"""The key-use audit's memory of (key, client address) pairs: a gateway meets millions of addresses."""

from __future__ import annotations

from typing import Any

from gateway.auth.audit import MAX_SEEN, AuditLog
from gateway.contracts import Principal

KEY = Principal(key_id="key_x", tenant_id="ten_x")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def audit(clock: Clock) -> AuditLog:
    db: Any = None  # key_used never touches the database
    return AuditLog(db, key_use_interval=3600.0, max_buffer=10, clock=clock)


def test_pairs_whose_interval_is_over_are_forgotten() -> None:
    clock = Clock()
    log = audit(clock)
    for i in range(50_000):
        log.key_used(KEY, client=f"10.0.{i // 256}.{i % 256}", surface="api")
    assert len(log._seen) == 50_000
    clock.now += 3600
    log.key_used(KEY, client="192.0.2.1", surface="api")
    assert len(log._seen) == 1  # was 50,001: kept until 100,000 pairs piled up


def test_the_pairs_remembered_are_capped_and_each_is_recorded_once_per_interval() -> None:
    clock = Clock()
    log = audit(clock)
    for i in range(MAX_SEEN + 1000):
        clock.now += 0.001
        log.key_used(KEY, client=f"c{i}", surface="api")
    assert len(log._seen) == MAX_SEEN  # was 101,000, each new pair past 100,000 copying them all
    recorded = len(log._buffer) + log.dropped
    log.key_used(KEY, client=f"c{MAX_SEEN + 999}", surface="api")  # seen a moment ago: not again
    log.key_used(KEY, client="c0", surface="api")  # forgotten (the oldest): recorded again, a row more
    assert len(log._buffer) + log.dropped == recorded + 1
    clock.now += 3600
    log.key_used(KEY, client=f"c{MAX_SEEN + 999}", surface="api")  # its interval is over
    assert len(log._buffer) + log.dropped == recorded + 2 and len(log._seen) <= 2
