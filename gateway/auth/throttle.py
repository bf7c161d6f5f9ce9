"""Failed-authentication throttle: per client address and per key prefix, in fixed windows.

Each failure (an unknown, revoked or expired key; a failed dashboard sign-in) counts against the
client's address and, when the token is shaped like one of our keys, against its visible prefix
(someone guessing one key from many addresses). Once a count reaches its limit, that address is
refused with 429 until the window that started with its first failure ends, before any key lookup.
A blocked prefix only turns the next failures under it into 429s: the key that owns the prefix still
authenticates, since its prefix is no secret (admins and dashboards show it) and whoever knows it
must not be able to lock its holder out by failing under it. Counts live in Redis when one is
configured (shared by every replica, ``throttle_redis``) and in process otherwise. Should Redis be unreachable, the
throttle lets requests through (authentication itself still decides) and logs it. In process, a
count is kept until its window ends, and then dropped (oldest first: a failure costs the same
however many addresses fail); a running one is never dropped sooner, however many there are.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import Protocol

from gateway.auth.keys import VISIBLE_CHARS, looks_like_key

log = logging.getLogger("switchyard.auth")

_KEY_CHARS = re.compile(r"[A-Za-z0-9_-]+")  # what a generated key is made of (url-safe base64)

class Throttled(Exception):
    """Too many failed attempts: refused for ``retry_after`` seconds."""

    def __init__(self, retry_after: int, scope: str) -> None:
        super().__init__(f"too many failed authentication attempts from this {scope}")
        self.retry_after = retry_after
        self.scope = scope


class FailureCounts(Protocol):
    def blocks_nobody(self) -> bool:
        """True when ``blocked`` would return 0 whatever it is asked, known without a round trip."""
        ...

    async def blocked(self, counters: dict[str, int]) -> float:
        """Seconds until every counter at its limit (name -> limit) has reset; 0 if none is."""
        ...

    async def fail(self, counters: dict[str, int], window: float) -> None:
        """Count a failure against each counter (name -> limit); a window starts at a counter's first."""
        ...


class MemoryFailures:
    """In-process counts (the embedded default: one process)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # name -> (count, window end), in the order the windows started: with the throttle's one
        # window length, the order they end in
        self._counts: dict[str, tuple[int, float]] = {}

    def blocks_nobody(self) -> bool:
        """True while no failure is counted (every window ended: the counts are dropped)."""
        if self._counts:
            self._expire(self._clock())
        return not self._counts

    async def blocked(self, counters: dict[str, int]) -> float:
        now, wait = self._clock(), 0.0
        for name, limit in counters.items():
            count, end = self._counts.get(name, (0, 0.0))
            if limit and end > now and count >= limit:
                wait = max(wait, end - now)
        return wait

    async def fail(self, counters: dict[str, int], window: float) -> None:
        now = self._clock()
        self._expire(now)
        counts = self._counts
        for name in counters:
            count, end = counts.get(name, (0, 0.0))
            if end > now:
                counts[name] = (count + 1, end)  # in place: its window goes on
            else:
                counts.pop(name, None)
                counts[name] = (1, now + window)  # a window starts: at the end

    def _expire(self, now: float) -> None:
        """Drop the counts at the front whose window ended (amortised O(1) a failure)."""
        counts = self._counts
        while counts:
            name = next(iter(counts))
            if counts[name][1] > now:
                return
            del counts[name]


def key_prefix(token: str | None) -> str | None:
    """The visible prefix of a token shaped like one of our keys (what the admin sees), else None:
    never text a client chose beyond the key alphabet, so it is safe to store and print."""
    if not token or not looks_like_key(token) or not _KEY_CHARS.fullmatch(token):
        return None
    return token[:VISIBLE_CHARS]


class AuthThrottle:
    def __init__(self, counts: FailureCounts, *, per_address: int, per_prefix: int, window: float) -> None:
        self.counts = counts
        self.per_address, self.per_prefix, self.window = per_address, per_prefix, window

    def _counters(self, address: str, token: str | None) -> dict[str, int]:
        counters = {f"addr:{address}": self.per_address}
        if (prefix := key_prefix(token)) is not None:
            counters[f"prefix:{prefix}"] = self.per_prefix
        return {name: limit for name, limit in counters.items() if limit > 0}

    def blocks_nobody(self) -> bool:
        """True when ``check`` would pass anyone: nothing is blocked (the usual case), and the
        caller may skip it (its counters and lookups cost a few µs a request)."""
        return self.counts.blocks_nobody()

    async def check(self, address: str) -> None:
        """Raise ``Throttled`` while the address is over its limit (before its key is looked up)."""
        if self.per_address and (wait := await self.counts.blocked({f"addr:{address}": self.per_address})) > 0:
            raise Throttled(max(1, math.ceil(wait)), "address")

    async def failed(self, address: str, token: str | None) -> None:
        """Count a failure; raise ``Throttled`` when the token's prefix was already over its limit."""
        counters = self._counters(address, token)
        prefix = {name: limit for name, limit in counters.items() if name.startswith("prefix:")}
        wait = await self.counts.blocked(prefix) if prefix else 0.0
        if counters:
            await self.counts.fail(counters, self.window)
        if wait > 0:
            raise Throttled(max(1, math.ceil(wait)), "key prefix")
