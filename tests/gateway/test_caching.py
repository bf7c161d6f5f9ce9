"""RefreshingCache: one load per key at a time, refresh ahead, never older than ttl, stale grace."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway import caching
from gateway.caching import RefreshingCache


class Loader:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = False

    async def __call__(self) -> int:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionError("database down")
        return self.calls


async def test_concurrent_misses_share_one_load() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(1.0)
    load = Loader(delay=0.05)
    values = await asyncio.gather(*(cache.get("k", load) for _ in range(64)))
    assert values == [1] * 64 and load.calls == 1


async def test_refresh_ahead_reloads_in_the_background() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(0.4)
    load = Loader(delay=0.05)
    assert await cache.get("k", load) == 1
    await asyncio.sleep(0.25)  # past half the ttl: served at once, reloaded behind the caller
    assert await cache.get("k", load) == 1
    assert await cache.get("k", load) == 1
    await asyncio.sleep(0.01)
    assert load.calls == 2  # one refresh, not one per hit
    await asyncio.sleep(0.1)
    assert await cache.get("k", load) == 2


async def test_never_older_than_ttl_while_loads_succeed() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(0.1)
    load = Loader()
    assert await cache.get("k", load) == 1
    await asyncio.sleep(0.15)
    assert await cache.get("k", load) == 2  # expired: the caller waits for the new value


async def test_a_slow_load_is_as_old_as_when_it_began() -> None:
    """The value was read when its load began: a load that took long (a slow database) leaves it
    fresh for the rest of the ttl, not a whole ttl more (a revocation must show within the ttl)."""
    cache: RefreshingCache[str, int] = RefreshingCache(0.3)
    load = Loader(delay=0.2)  # reads at the start, answers 0.2 s later
    assert await cache.get("k", load) == 1
    await asyncio.sleep(0.15)  # 0.35 s after the read, 0.15 s after the answer
    assert await cache.get("k", load) == 2


async def test_stale_grace_when_the_loader_fails() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(0.05, stale_grace=0.3)
    load = Loader()
    assert await cache.get("k", load) == 1
    load.fail = True
    await asyncio.sleep(0.1)
    assert await cache.get("k", load) == 1  # expired, load failed, within grace
    await asyncio.sleep(0.3)
    with pytest.raises(ConnectionError):
        await cache.get("k", load)
    with pytest.raises(ConnectionError):
        await cache.get("other", load)  # nothing cached: the error propagates


async def test_clear_keeps_a_load_under_way_from_storing() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(10.0)
    load = Loader(delay=0.05)
    pending = asyncio.ensure_future(cache.get("k", load))
    await asyncio.sleep(0.01)
    cache.clear()  # e.g. a key was revoked while its lookup was in flight
    assert await pending == 1
    assert await cache.get("k", load) == 2


async def test_bounded() -> None:
    cache: RefreshingCache[int, int] = RefreshingCache(10.0, max_entries=3)
    for i in range(5):
        await cache.get(i, Loader())
    assert len(cache._entries) == 3


async def test_while_loads_fail_only_the_first_request_waits_and_retries_are_spaced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A database slow to refuse costs one request its wait, not every request: until a load
    succeeds, the entry answers at once and a background load retries now and then."""
    monkeypatch.setattr(caching, "RETRY_SECONDS", 0.3)
    cache: RefreshingCache[str, int] = RefreshingCache(0.3, stale_grace=10.0, name="keys")
    load = Loader()
    assert await cache.get("k", load) == 1
    load.fail, load.delay = True, 0.5  # a database that takes its time to refuse
    await asyncio.sleep(0.31)
    with caplog.at_level(logging.INFO, "switchyard.cache"):
        t0 = time.monotonic()
        assert await cache.get("k", load) == 1  # this one waits for the failing load
        assert time.monotonic() - t0 >= 0.5
        t0 = time.monotonic()
        assert [await cache.get("k", load) for _ in range(50)] == [1] * 50
        assert time.monotonic() - t0 < 0.25  # the others answer at once, with no load of their own
        assert load.calls == 2
        await asyncio.sleep(0.3)
        assert await cache.get("k", load) == 1  # a retry starts, behind the answer
        await asyncio.sleep(0.6)
        assert load.calls == 3  # ... and fails
        load.fail, load.delay = False, 0.05
        assert await cache.get("k", load) == 1 and load.calls == 3  # too soon for the next retry
        await asyncio.sleep(0.3)
        assert await cache.get("k", load) == 1  # the next retry, which works
        await asyncio.sleep(0.1)
        assert await cache.get("k", load) == 4  # fresh again
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("keys: loads failing (ConnectionError: database down)")
    assert messages[1] == "keys: loads work again"
