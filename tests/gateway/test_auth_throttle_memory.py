"""The failed-authentication throttle's memory under a flood of addresses (a botnet, or one IPv6
network): counts and blocks go as their windows end, oldest first, each failure costing the same
however many addresses failed; at most ``MAX_ENTRIES`` of each are kept, and a flood of new
addresses never lifts a block."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from gateway.auth.throttle import MAX_ENTRIES, AuthThrottle, FailureCounts, MemoryFailures, Throttled
from gateway.auth.throttle_redis import RedisFailures
from gateway.quotas.redis_client import RespClient
from tests.gateway.test_auth_throttle_redis import no_round_trips, until
from tests.support.redis_server import RedisProcess

WINDOW = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(counts: FailureCounts) -> AuthThrottle:
    return AuthThrottle(counts, per_address=3, per_prefix=0, window=WINDOW)


def address(i: int) -> str:
    return f"2001:db8::{i:x}"


async def test_counts_go_as_their_windows_end_and_an_address_over_its_limit_stays_blocked() -> None:
    clock = Clock()
    counts = MemoryFailures(clock)
    guard = throttle(counts)
    for i in range(40_000):
        await guard.failed(address(i), None)
    clock.now += 30
    for _ in range(3):
        await guard.failed("10.9.0.1", None)
    for i in range(40_000, 80_000):
        await guard.failed(address(i), None)
    clock.now += 31  # the first 40,000 windows ended
    await guard.failed(address(80_000), None)
    assert len(counts._counts) == 40_001 and len(counts._blocks) == 1  # 80,001 until the first ended
    with pytest.raises(Throttled) as blocked:
        await guard.check("10.9.0.1")
    assert blocked.value.retry_after == 29
    await guard.failed(address(40_000), None)  # its window goes on: a second failure
    assert counts._counts[f"addr:{address(40_000)}"] == (2, 1090.0)
    clock.now += 29  # every window ended but the last one's
    assert guard.blocks_nobody() and not counts._blocks  # a count below its limit blocks nobody
    await guard.check("10.9.0.1")
    await guard.failed("10.9.0.2", None)
    assert list(counts._counts) == [f"addr:{address(80_000)}", "addr:10.9.0.2"]


async def test_a_failure_costs_the_same_however_many_addresses_failed() -> None:
    clock = Clock()
    counts = MemoryFailures(clock)
    guard = throttle(counts)
    for _ in range(3):
        await guard.failed("10.9.0.1", None)
    for i in range(110_000):
        await guard.failed(address(i), None)
    started = time.perf_counter()
    for i in range(110_000, 112_000):  # each copied every count there was: seconds, not milliseconds
        await guard.failed(address(i), None)
    assert time.perf_counter() - started < 2.0
    with pytest.raises(Throttled):  # a block from before the flood still blocks
        await guard.check("10.9.0.1")


async def test_a_flood_of_addresses_keeps_at_most_max_entries_and_lifts_no_block() -> None:
    """Within one window, a flood of new addresses (IPv6 gives millions) grows memory only to
    ``MAX_ENTRIES`` counts (the oldest go first) and ``MAX_ENTRIES`` blocks, and lifts no block."""
    clock = Clock()
    counts = MemoryFailures(clock)
    guard = throttle(counts)
    for _ in range(3):
        await guard.failed("10.9.0.1", None)
    for _ in range(2):
        await guard.failed(address(0), None)
    for i in range(1, MAX_ENTRIES + 1000):
        await guard.failed(address(i), None)
        clock.now += 10 / MAX_ENTRIES  # all within the window
    assert len(counts._counts) == MAX_ENTRIES and len(counts._blocks) == 1
    with pytest.raises(Throttled):
        await guard.check("10.9.0.1")
    await guard.failed(address(0), None)  # its count went first: one failure again
    await guard.check(address(0))
    await guard.failed(address(MAX_ENTRIES + 999), None)  # a count kept: its limit still holds
    await guard.failed(address(MAX_ENTRIES + 999), None)
    with pytest.raises(Throttled):
        await guard.check(address(MAX_ENTRIES + 999))
    for i in range(MAX_ENTRIES + 1000):  # blocks too: at most MAX_ENTRIES, the oldest go first
        name = f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"
        for _ in range(3):
            await guard.failed(name, None)
    assert len(counts._blocks) == MAX_ENTRIES and len(counts._counts) <= MAX_ENTRIES
    with pytest.raises(Throttled):
        await guard.check("10.1.134.159")  # the last one (100,999)
    await guard.check("10.0.0.0")


@pytest.fixture
async def replica() -> AsyncIterator[tuple[RedisFailures, Clock]]:
    """A replica following the blocks on a redis-server of its own, on a clock the test moves."""
    server, clock = RedisProcess().start(), Clock()
    counts = RedisFailures(RespClient.from_url(server.url, timeout=0.5), clock=clock)
    counts.start()
    try:
        await until(lambda: counts.following)
        yield counts, clock
    finally:
        await counts.aclose()
        await counts.redis.aclose()
        server.stop()


def blocked_by_another(counts: RedisFailures, name: str, seconds: float) -> None:
    """A block as another replica's failure publishes it (what the subscription hands over)."""
    counts._on_message(f"{int(seconds * 1000)} {name}".encode())


async def test_blocks_go_as_they_end_and_a_running_one_still_blocks(replica: tuple[RedisFailures, Clock]) -> None:
    counts, clock = replica
    no_round_trips(counts)
    guard = throttle(counts)
    for i in range(40_000):
        blocked_by_another(counts, f"addr:{address(i)}", WINDOW)
    clock.now += 30
    for i in range(40_000, 80_000):
        blocked_by_another(counts, f"addr:{address(i)}", WINDOW)
    clock.now += 31  # the first 40,000 ended
    assert not guard.blocks_nobody() and len(counts._blocks) == 40_000  # was 80,000 until all had ended
    with pytest.raises(Throttled) as blocked:
        await guard.check(address(79_999))
    assert blocked.value.retry_after == 29
    await guard.check(address(0))
    blocked_by_another(counts, "addr:short", 5)  # one that ends sooner, behind those running
    clock.now += 6
    await guard.check("short")  # ended, though kept behind them
    clock.now += 23
    assert guard.blocks_nobody() and not counts._blocks


async def test_a_block_costs_the_same_however_many_are_running(replica: tuple[RedisFailures, Clock]) -> None:
    counts, _ = replica
    no_round_trips(counts)
    for i in range(MAX_ENTRIES - 2000):
        blocked_by_another(counts, f"addr:{address(i)}", WINDOW)
    started = time.perf_counter()
    for i in range(MAX_ENTRIES - 2000, MAX_ENTRIES):  # each copied every block: seconds, not milliseconds
        blocked_by_another(counts, f"addr:{address(i)}", WINDOW)
    assert time.perf_counter() - started < 2.0
    with pytest.raises(Throttled):  # none was dropped while running
        await throttle(counts).check(address(0))


async def test_beyond_max_entries_the_oldest_block_goes_and_is_checked_in_redis(
    replica: tuple[RedisFailures, Clock],
) -> None:
    """The blocks in memory stay at ``MAX_ENTRIES``; while one dropped for room would still run, a
    check that finds no block in memory asks Redis, where the block still is."""
    counts, clock = replica
    guard = throttle(counts)
    await counts.redis.execute("SET", f"{counts.prefix}:addr:{address(0)}", "3", "PX", "60000")
    for i in range(MAX_ENTRIES + 1000):
        blocked_by_another(counts, f"addr:{address(i)}", WINDOW)
    assert len(counts._blocks) == MAX_ENTRIES and f"addr:{address(0)}" not in counts._blocks
    assert not guard.blocks_nobody()
    with pytest.raises(Throttled):  # dropped from memory, found in Redis
        await guard.check(address(0))
    await guard.check("10.9.0.1")  # in Redis too: not blocked
    with pytest.raises(Throttled):
        await guard.check(address(MAX_ENTRIES + 999))
    clock.now += WINDOW + 1  # every block ended, the dropped ones too
    assert guard.blocks_nobody() and not counts._blocks
    no_round_trips(counts)
    await guard.check(address(MAX_ENTRIES + 999))
