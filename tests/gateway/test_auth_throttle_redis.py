"""The failed-authentication throttle's Redis counts (gateway/auth/throttle_redis.py) on a real
redis-server: blocks reach every replica through the channel and are checked without a round trip."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from gateway.auth.throttle import AuthThrottle, FailureCounts, MemoryFailures, Throttled
from gateway.auth.throttle_redis import RedisFailures
from gateway.quotas.redis_client import RespClient
from tests.support.redis_server import RedisProcess


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    proc = RedisProcess().start()
    yield proc
    proc.stop()


@pytest.fixture
async def replicas(server: RedisProcess) -> AsyncIterator[Callable[[], Awaitable[RedisFailures]]]:
    """Start a replica's counts (following the blocks) on the server; all are closed afterwards."""
    started: list[RedisFailures] = []

    async def start() -> RedisFailures:
        counts = RedisFailures(RespClient.from_url(server.url, timeout=0.5))
        counts.start()
        started.append(counts)
        await until(lambda: counts.following)
        return counts

    yield start
    for counts in started:
        await counts.aclose()
        await counts.redis.aclose()


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def no_round_trips(counts: RedisFailures) -> None:
    async def refuse(keys: list[str], args: list[object]) -> object:
        raise AssertionError("checked in Redis")

    counts._blocked = refuse  # type: ignore[assignment,method-assign]


def throttle(counts: FailureCounts, window: float = 60) -> AuthThrottle:
    return AuthThrottle(counts, per_address=3, per_prefix=0, window=window)


async def test_a_block_reaches_every_replica_and_is_checked_in_memory(
    replicas: Callable[[], Awaitable[RedisFailures]],
) -> None:
    a, b = await replicas(), await replicas()
    no_round_trips(a)
    no_round_trips(b)
    for i in range(3):
        await throttle(a if i % 2 else b).check("10.1.0.1")  # not blocked yet: no round trip either
        await throttle(a if i % 2 else b).failed("10.1.0.1", None)
    with pytest.raises(Throttled) as blocked:  # the replica whose failure reached the limit: at once
        await throttle(b).check("10.1.0.1")
    assert blocked.value.scope == "address" and 59 <= blocked.value.retry_after <= 60
    await until(lambda: "addr:10.1.0.1" in a._blocks)  # the other: by the channel
    with pytest.raises(Throttled):
        await throttle(a).check("10.1.0.1")
    await throttle(a).check("10.1.0.2")  # other addresses are not


async def test_nobody_blocked_is_known_in_memory_and_ends_with_the_last_block(
    server: RedisProcess, replicas: Callable[[], Awaitable[RedisFailures]],
) -> None:
    """``blocks_nobody`` lets the request path skip the check: true only while the replica follows
    the blocks and none is running (an ended one is forgotten), never while it asks Redis."""
    a, b = await replicas(), await replicas()
    assert throttle(a).blocks_nobody() and throttle(b).blocks_nobody()
    for _ in range(3):
        await throttle(a, window=0.5).failed("10.5.0.1", None)
    assert not throttle(a).blocks_nobody()
    await until(lambda: not throttle(b).blocks_nobody())  # by the channel
    with pytest.raises(Throttled):
        await throttle(b).check("10.5.0.1")
    await until(lambda: throttle(a).blocks_nobody() and throttle(b).blocks_nobody())  # the window ended
    assert not a._blocks and not b._blocks
    await throttle(b).check("10.5.0.1")
    admin = RespClient.from_url(server.url)
    try:
        await admin.execute("CLIENT", "KILL", "TYPE", "pubsub")
        await until(lambda: not b.following)
        assert not throttle(b).blocks_nobody()  # it may have missed a block: checks go to Redis
    finally:
        await admin.aclose()


async def test_in_process_counts_block_nobody_while_no_failure_is_counted() -> None:
    counts = MemoryFailures()
    assert throttle(counts).blocks_nobody()
    for _ in range(3):
        await throttle(counts, window=0.3).failed("10.6.0.1", None)
    assert not throttle(counts).blocks_nobody()
    with pytest.raises(Throttled):
        await throttle(counts).check("10.6.0.1")
    await asyncio.sleep(0.35)  # the window ended: its counts go
    assert throttle(counts).blocks_nobody()
    await throttle(counts).check("10.6.0.1")


async def test_a_replica_that_starts_later_loads_the_blocks_running(
    replicas: Callable[[], Awaitable[RedisFailures]],
) -> None:
    a = await replicas()
    for _ in range(3):
        await throttle(a, window=0.6).failed("10.2.0.1", None)
    late = await replicas()
    no_round_trips(late)
    with pytest.raises(Throttled):
        await throttle(late).check("10.2.0.1")
    await asyncio.sleep(0.7)  # the window that started with the first failure ends
    await throttle(late).check("10.2.0.1")


async def test_a_replica_whose_subscription_breaks_checks_in_redis_until_it_follows_again(
    server: RedisProcess, replicas: Callable[[], Awaitable[RedisFailures]],
) -> None:
    a, b = await replicas(), await replicas()
    admin = RespClient.from_url(server.url)
    try:
        assert await admin.execute("CLIENT", "KILL", "TYPE", "pubsub") == 2
        await until(lambda: not b.following)
        for _ in range(3):
            await throttle(a).failed("10.3.0.1", None)  # published while b does not listen
        with pytest.raises(Throttled):
            await throttle(b).check("10.3.0.1")  # asked Redis meanwhile
        await until(lambda: b.following)  # subscribed again, and loaded what it missed
        no_round_trips(b)
        with pytest.raises(Throttled):
            await throttle(b).check("10.3.0.1")
    finally:
        await admin.aclose()


async def test_without_redis_the_throttle_lets_requests_through(server: RedisProcess) -> None:
    counts = RedisFailures(RespClient.from_url(server.url, timeout=0.5))
    server.stop()
    counts.start()  # keeps trying to follow, quietly
    try:
        await throttle(counts).failed("10.4.0.1", None)
        await throttle(counts).check("10.4.0.1")
        assert not counts.following
    finally:
        await counts.aclose()
        await counts.redis.aclose()
