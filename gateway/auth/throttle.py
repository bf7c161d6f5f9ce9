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
however many addresses fail); beyond ``MAX_ENTRIES`` running ones, the oldest is dropped sooner.
Blocks are kept apart from the counts below their limit (with a cap of their own), so a flood of
single failures from new addresses never drops a block.
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
# Most counts, and most blocks, kept in process (each: ~250 bytes): beyond, the oldest goes first,
# so a flood of addresses (IPv6 gives millions) costs bounded memory within a window
MAX_ENTRIES = 100_000

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
        # name -> (count, window end), in the order the windows started (with the throttle's one
        # window length, the order they end in): those below their limit, and those at it
        self._counts: dict[str, tuple[int, float]] = {}
        self._blocks: dict[str, tuple[int, float]] = {}

    def blocks_nobody(self) -> bool:
        """True while nothing is blocked (every block's window ended: they are dropped)."""
        if self._blocks:
            _expire(self._blocks, self._clock())
        return not self._blocks

    async def blocked(self, counters: dict[str, int]) -> float:
        now, wait = self._clock(), 0.0
        for name, limit in counters.items():
            if limit and (end := self._blocks.get(name, _NONE)[1]) > now:
                wait = max(wait, end - now)
        return wait

    async def fail(self, counters: dict[str, int], window: float) -> None:
        now = self._clock()
        counts, blocks = self._counts, self._blocks
        _expire(counts, now)
        _expire(blocks, now)
        for name, limit in counters.items():
            if blocks.get(name, _NONE)[1] > now:
                continue  # blocked: its window goes on
            blocks.pop(name, None)  # one that ended behind a running one
            count, end = counts.get(name, _NONE)
            if end <= now:
                counts.pop(name, None)
                count, end = 0, now + window  # a window starts
            if limit and count + 1 >= limit:
                counts.pop(name, None)
                _keep(blocks, name, (count + 1, end))
            elif count:
                counts[name] = (count + 1, end)  # in place: its window goes on
            else:
                _keep(counts, name, (1, end))


_NONE = (0, 0.0)


def _keep(entries: dict[str, tuple[int, float]], name: str, value: tuple[int, float]) -> None:
    """Add an entry at the end; when ``MAX_ENTRIES`` are kept, the oldest goes first."""
    if len(entries) >= MAX_ENTRIES:
        del entries[next(iter(entries))]
    entries[name] = value


def _expire(entries: dict[str, tuple[int, float]], now: float) -> None:
    """Drop the entries at the front whose window ended (amortised O(1) a failure). A block that
    ended behind a running one waits for it, a window at most; ``blocked`` reads it as ended."""
    while entries:
        name = next(iter(entries))
        if entries[name][1] > now:
            return
        del entries[name]


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
