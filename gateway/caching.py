"""An in-process cache for what the request path reads from SQL (keys, limits).

Each value is fresh for ``ttl`` seconds from when its load began (a slow load eats into that
time) and is never served older than that while the database answers, so a change (a revoked key,
new limits) is seen within ``ttl`` on every replica. Three things keep the database off the hot path:

- one load per key at a time: concurrent callers that miss wait on the same load (no thundering
  herd when a busy key's entry expires under 64 concurrent requests);
- refresh ahead: a hit past half its ttl starts a background reload, so a key in steady use is
  reloaded before it expires and no request waits for SQL;
- stale grace: when a load fails (database down), an entry up to ``stale_grace`` seconds old keeps
  answering; beyond that the error propagates. Only the first request to find a key's load
  failing waits for it: until a load of that key succeeds, its entry answers at once while a
  background load retries, at most once every ``RETRY_SECONDS`` (a database that takes seconds to
  refuse a connection would otherwise cost every request those seconds). The cache logs when its
  loads start failing and when they work again, not each request answered from an old entry.

``clear()`` drops everything and keeps loads already under way from storing what they read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

log = logging.getLogger("switchyard.cache")

RETRY_SECONDS = 1.0  # while a key's loads fail, how often a background load tries again

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RefreshingCache(Generic[K, V]):
    def __init__(self, ttl: float, *, stale_grace: float = 300.0, max_entries: int = 10_000,
                 name: str = "cache") -> None:
        self.ttl = ttl
        self.stale_grace = stale_grace
        self.max_entries = max_entries
        self.name = name
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()  # key -> (loaded at, value)
        self._loading: dict[K, asyncio.Future[V]] = {}
        self._failing: dict[K, float] = {}  # key -> when its last load failed (none has succeeded since)
        self._generation = 0

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        entry = self._entries.get(key)
        now = time.monotonic()
        if entry is not None:
            age = now - entry[0]
            if age < self.ttl:
                if age >= self.ttl / 2 and key not in self._loading:
                    self._start(key, load).add_done_callback(_ignore_failure)
                return entry[1]
            failed_at = self._failing.get(key)
            if failed_at is not None and age <= self.stale_grace:  # failing: answer now, retry behind
                if key not in self._loading and now - failed_at >= RETRY_SECONDS:
                    self._start(key, load).add_done_callback(_ignore_failure)
                return entry[1]
        try:
            return await asyncio.shield(self._loading.get(key) or self._start(key, load))
        except Exception:
            if entry is None or time.monotonic() - entry[0] > self.stale_grace:
                raise
            return entry[1]

    def clear(self) -> None:
        self._entries.clear()
        self._loading.clear()
        self._failing.clear()
        self._generation += 1

    def _start(self, key: K, load: Callable[[], Awaitable[V]]) -> asyncio.Future[V]:
        task = asyncio.ensure_future(self._load(key, load, self._generation))
        self._loading[key] = task
        return task

    async def _load(self, key: K, load: Callable[[], Awaitable[V]], generation: int) -> V:
        started = time.monotonic()  # what the load reads is as old as this, however long it takes
        try:
            value = await load()
        except Exception as exc:
            if generation == self._generation:
                self._failed(key, exc)
            raise
        finally:
            if generation == self._generation:
                self._loading.pop(key, None)
        if generation == self._generation:
            if self._failing.pop(key, None) is not None and not self._failing:
                log.warning("%s: loads work again", self.name)
            self._entries[key] = (started, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._failing.pop(self._entries.popitem(last=False)[0], None)
        return value

    def _failed(self, key: K, exc: Exception) -> None:
        """Note a failed load of a key its entry can still answer for (without one, the caller
        gets the error)."""
        if key not in self._entries:
            return
        if not self._failing:
            log.warning("%s: loads failing (%s: %s); entries up to %.0f s old answer meanwhile", self.name,
                        type(exc).__name__, exc, self.stale_grace)
        self._failing[key] = time.monotonic()


def _ignore_failure(task: asyncio.Future[Any]) -> None:
    """A background refresh that failed is retried by the next caller once the entry expires."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("background refresh failed: %s", task.exception())
