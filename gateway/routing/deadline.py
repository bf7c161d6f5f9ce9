"""A request's time: its model group's ``timeout`` from its first attempt to its answer (a stream's
first chunk), retries, their waits and fallbacks included (``Deadline``), and the waits themselves.

The group the client named sets it; the fallbacks tried for the request inherit it (their own
``timeout`` governs only requests that name them). The attempt in flight when it runs out is
cancelled, as a client going away cancels it (its upstream connection closed), and fails with
``DeadlineExceeded``: the 504 ``upstream_timeout`` an upstream's own timeout gets. It is a timeout of
the deployment (its circuit, its latency) only when the attempt had the request's whole time (sent
at its start: the first attempt, no wait before it): given all the time the model allows, the
deployment answered nothing, as a hanging one whose own ``timeouts`` are longer would never be
found out otherwise. An attempt left less (after other attempts, backoffs or a hold-off) is no
verdict: it may have had only the last moments. A stream that has begun is not cut: its
deployment's ``idle`` and ``total`` timeouts bound it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from backends.base import Timeout
from gateway.routing.health import DeploymentHealth

T = TypeVar("T")
TIMER_SLACK = 0.01  # seconds an event loop's timer may fire early (uvloop's have millisecond resolution)


class DeadlineExceeded(Timeout):
    """The request's time ran out: nothing more is tried; the deployment is blamed only when the
    attempt had the whole time (``whole``)."""

    retryable = False

    def __init__(self, message: str, *, whole: bool = False) -> None:
        super().__init__(message)
        self.blames_deployment = whole


class Deadline:
    """When a request's time runs out (``seconds`` from now; None: never)."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._at = None if seconds is None else clock() + seconds

    def left(self) -> float | None:
        """The seconds left (0 once run out), or None without a limit."""
        return None if self._at is None else max(0.0, self._at - self._clock())

    @property
    def expired(self) -> bool:
        return self.left() == 0.0

    def allows(self, wait: float) -> bool:
        """Whether a wait of ``wait`` seconds would end before the request's time does."""
        left = self.left()
        return left is None or wait < left

    def exceeded(self, model: str, whole: bool = False) -> DeadlineExceeded:
        return DeadlineExceeded(f"'{model}' was not answered within its timeout of {self.seconds:g} s "
                                "(retries and fallbacks included)", whole=whole)

    def bound(self, awaitable: Awaitable[T], model: str, whole: bool = False) -> Awaitable[T]:
        """``awaitable``, unless the time runs out first: then it is cancelled (an upstream connection
        closed, as when the client goes away) and ``DeadlineExceeded`` raised, blaming the deployment
        if ``whole`` (the attempt had the request's whole time). Without a limit, itself."""
        return awaitable if self._at is None else self._within(awaitable, model, whole)

    async def _within(self, awaitable: Awaitable[T], model: str, whole: bool) -> T:
        try:
            async with asyncio.timeout(self.left()) as scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise self.exceeded(model, whole) from None
            raise


async def wait_out(delay: float, health: DeploymentHealth, tenant: str) -> None:
    """Sleep ``delay`` seconds, then whatever little is left of the deployment's hold (for ``tenant``):
    the timer may end the sleep just before the hold it waited out (a longer hold, set meanwhile, is
    not waited)."""
    await asyncio.sleep(delay)
    if 0 < (left := health.held_for(tenant)) <= TIMER_SLACK:
        await asyncio.sleep(left + 0.001)
