"""Failed-authentication counts in Redis, shared by every replica, checked without a round trip.

Failures are counted in Redis (one script call per failure). The failure that brings a counter to
its limit also adds it to a sorted set of blocks (scored by when its window ends) and publishes
it; every replica follows that channel and keeps the blocks in memory, so checking a request (the
common case: nobody is blocked) costs no round trip. A replica that starts, or whose subscription
broke, loads the set after subscribing, and until it has, checks each request in Redis as before.
A replica applies the blocks its own failures make at once; another's reach it with the message,
within a turn of its event loop of the failure's reply. The blocks in memory are kept in the order
they came and dropped from the front as they end: each is gone within a window of its coming. At
most ``MAX_ENTRIES`` are kept (the oldest goes first); while one dropped so would still run, a check
that finds no block in memory asks Redis, so memory stays bounded and no block is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.auth.throttle import MAX_ENTRIES
from gateway.background import stop_task
from gateway.quotas.redis_client import RedisError, RespClient

log = logging.getLogger("switchyard.auth")

# KEYS: counters; ARGV: their limits (0: none). The longest wait (ms) among those at their limit.
_BLOCKED = """
local wait = 0
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[i])
  if limit > 0 and tonumber(redis.call('GET', key) or '0') >= limit then
    wait = math.max(wait, redis.call('PTTL', key))
  end
end
return wait
"""
# KEYS: counters, then the set of blocks; ARGV: the window (ms), the channel, the counters' names
# and limits (0: none). A counter's first failure starts its window; one at its limit is added to
# the blocks and published as "<ms left> <name>". Returns those, as {name, ms, name, ms, ...}.
_FAIL = """
local n = #KEYS - 1
local blocks = KEYS[n + 1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, n do
  local count = redis.call('INCR', KEYS[i])
  if count == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
  local limit = tonumber(ARGV[2 + n + i])
  if limit > 0 and count >= limit then
    local left = redis.call('PTTL', KEYS[i])
    local name = ARGV[2 + i]
    redis.call('ZADD', blocks, now + left, name)
    redis.call('PEXPIRE', blocks, math.max(left, redis.call('PTTL', blocks)))
    redis.call('PUBLISH', ARGV[2], left .. ' ' .. name)
    out[#out + 1] = name
    out[#out + 1] = left
  end
end
redis.call('ZREMRANGEBYSCORE', blocks, '-inf', now)
return out
"""
# KEYS: the set of blocks. Those still running, as {name, ms left, ...}.
_LOAD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #found, 2 do
  out[#out + 1] = found[i]
  out[#out + 1] = tonumber(found[i + 1]) - now
end
return out
"""


class RedisFailures:
    """Counts shared by every replica (``FailureCounts``); ``start`` follows the blocks."""

    def __init__(self, redis: RespClient, prefix: str = "sy:authfail",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self._clock = clock
        self.prefix = prefix
        self.channel = f"{prefix}:blocks:{redis.db}"  # channels span databases; the set does not
        self._blocked = redis.register_script(_BLOCKED)
        self._fail = redis.register_script(_FAIL)
        self._load = redis.register_script(_LOAD)
        self._blocks: dict[str, float] = {}  # name -> when (by the clock) its block ends, in the order they came
        self._following = False  # subscribed and loaded: the blocks in memory are complete
        self._dropped_until = 0.0  # when the last block dropped for room ends (0: none running)
        self._task: asyncio.Task[None] | None = None
        self._warned = float("-inf")  # when the outage was last logged (once a minute, not per request)

    @property
    def following(self) -> bool:
        return self._following

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow(), name="auth-blocks")

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    def blocks_nobody(self) -> bool:
        if not self._following or (self._dropped_until and not self._all_kept()):
            return False
        if self._blocks:
            self._expire(self._clock())
        return not self._blocks

    async def blocked(self, counters: dict[str, int]) -> float:
        if self._following:
            now, wait = self._clock(), 0.0
            for name in counters:
                if (ends := self._blocks.get(name)) is not None:
                    if ends > now:
                        wait = max(wait, ends - now)
                    else:
                        del self._blocks[name]
            if wait or not self._dropped_until or self._all_kept():
                return wait
        names = list(counters)
        try:
            reply = await self._blocked([f"{self.prefix}:{n}" for n in names], [counters[n] for n in names])
        except (RedisError, ConnectionError) as exc:
            self._warn(exc)
            return 0.0
        return max(0, int(reply)) / 1000 if isinstance(reply, int) else 0.0

    async def fail(self, counters: dict[str, int], window: float) -> None:
        names = list(counters)
        keys = [f"{self.prefix}:{n}" for n in names] + [f"{self.prefix}:blocks"]
        try:
            reached = await self._fail(keys, [max(1, int(window * 1000)), self.channel, *names,
                                              *(counters[n] for n in names)])
        except (RedisError, ConnectionError) as exc:
            self._warn(exc)
            return
        self._apply(reached)  # at once here; the other replicas get it from the channel

    # ------------------------------------------------------------ following the blocks

    async def _follow(self) -> None:
        pause = 0.5
        while True:
            try:
                subscription = await self.redis.subscribe(self.channel, self._on_message)
                try:
                    self._apply(await self._load([f"{self.prefix}:blocks"], []))
                    self._following, pause = True, 0.5
                    await subscription.closed
                finally:
                    self._following = False
                    subscription.close()
            except (RedisError, ConnectionError) as exc:
                self._warn(exc, "blocks are checked in Redis for each request until the channel is followed again")
            except Exception:
                log.exception("following the auth throttle's blocks failed; checking each request in Redis")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _on_message(self, data: bytes) -> None:
        left, _, name = data.decode(errors="replace").partition(" ")
        with contextlib.suppress(ValueError):
            self._block(name, int(left))

    def _apply(self, reply: object) -> None:
        """Blocks from a script's {name, ms left, ...} reply."""
        items = reply if isinstance(reply, list) else []
        for name, left in zip(items[::2], items[1::2], strict=False):
            self._block(name.decode() if isinstance(name, bytes) else str(name), int(left))

    def _block(self, name: str, left_ms: int) -> None:
        now = self._clock()
        self._expire(now)
        ends = now + left_ms / 1000
        if ends > (blocks := self._blocks).get(name, 0.0):
            if blocks.pop(name, None) is None and len(blocks) >= MAX_ENTRIES:
                oldest = next(iter(blocks))
                self._dropped_until = max(self._dropped_until, blocks.pop(oldest))
            blocks[name] = ends  # at the end, with the latest

    def _all_kept(self) -> bool:
        """True once every block dropped for room has ended: those in memory are all there are."""
        if self._dropped_until > self._clock():
            return False
        self._dropped_until = 0.0
        return True

    def _expire(self, now: float) -> None:
        """Drop the blocks at the front that ended (amortised O(1) a block). One that ended behind a
        running one waits for it, a window at most; ``blocked`` reads it as ended meanwhile."""
        blocks = self._blocks
        while blocks:
            name = next(iter(blocks))
            if blocks[name] > now:
                return
            del blocks[name]

    def _warn(self, exc: Exception, meanwhile: str = "failed attempts are not counted meanwhile") -> None:
        if (now := time.monotonic()) - self._warned >= 60:
            self._warned = now
            log.warning("auth throttle unavailable (%s): %s", type(exc).__name__, meanwhile)
