"""Draining a gateway process on SIGTERM.

The first SIGTERM makes ``/readyz`` fail at once (load balancers stop sending new requests) while
requests are still served; after ``readiness_seconds`` uvicorn stops accepting connections and
waits for the requests in flight. Streams still running ``drain_seconds`` after that are cut: the
relay stops reading the provider (which is closed), sends a last chunk with ``finish_reason``
``length`` and the usage so far, and settles the request like any other, before the process
exits. A second SIGTERM (or a SIGINT) ends the drain at once: the listener closes now if it is
still open, and the streams still running are cut now (each with its last chunk, settled), so the
process exits as soon as they are.

A worker a rolling restart replaced (``RETIRE_SIGNAL``, from the supervisor) drains as on a SIGTERM,
but closes its listener at once and stays ready: the host still serves, through its other workers
and the one that replaced it, and a load balancer must not take it out. A SIGTERM to a retiring
worker ends its drain at once, as a second one does.

The state is the process's (``DRAIN``): a SIGTERM is addressed to the whole process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

log = logging.getLogger("switchyard.drain")

_CUT = object()  # what ``next_or_cut`` returns once the drain time is over
RETIRE_SIGNAL = signal.SIGUSR2  # the supervisor's word to a worker that a rolling restart replaced


class Drain:
    def __init__(self) -> None:
        self.draining = False  # the process is winding down: streams race the drain time
        self.retiring = False  # ... because a rolling restart replaced it, not because the server stops
        self._cut: asyncio.Event | None = None
        # the relays' wakers for a read the drain time does not race (begun before the drain): each
        # is called when the time runs out, so that its stream is cut then (``SSERelay``)
        self.wakers: set[Callable[[], None]] = set()
        self._stop: Callable[[], None] | None = None  # uvicorn's own SIGTERM handling, until called
        self._timers: tuple[asyncio.TimerHandle, ...] = ()

    @property
    def cut(self) -> asyncio.Event:
        if self._cut is None:
            self._cut = asyncio.Event()
        return self._cut

    async def accepting(self) -> bool:
        """A readiness check: False from the first SIGTERM on (not when a rolling restart retires
        this worker)."""
        return self.retiring or not self.draining

    def _begin(self, loop: asyncio.AbstractEventLoop, readiness_seconds: float, drain_seconds: float,
               stop: Callable[[], None]) -> None:
        self._stop = stop
        self._timers = (loop.call_later(readiness_seconds, self._stop_once),
                        loop.call_later(readiness_seconds + drain_seconds, self._cut_now))

    def _stop_once(self) -> None:
        """Have uvicorn close the listener and wait for the requests in flight (once)."""
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()

    def _end_now(self) -> None:
        """A second SIGTERM: the stop and the cut, now rather than when their time comes."""
        for timer in self._timers:
            timer.cancel()
        self._stop_once()
        self._cut_now()

    def _cut_now(self) -> None:
        """The drain time is over: reads racing it end, and the reads it does not race are woken."""
        self.cut.set()
        for wake in tuple(self.wakers):
            wake()

    async def next_or_cut(self, chunks: AsyncIterator[Any]) -> Any:
        """The next chunk, or ``CUT`` when the drain time ends first (the pending read is cancelled)."""
        if self.cut.is_set():
            return _CUT
        read = asyncio.ensure_future(anext(chunks))
        cut = asyncio.ensure_future(self.cut.wait())
        await asyncio.wait((read, cut), return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        if read.done():
            return read.result()  # StopAsyncIteration included
        read.cancel()
        await asyncio.gather(read, return_exceptions=True)
        return _CUT

    def install(self, readiness_seconds: float, drain_seconds: float) -> bool:
        """Take SIGTERM (and SIGINT, while draining) before uvicorn does, and ``RETIRE_SIGNAL``
        (call from the app's start-up, in the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)
        previous_int = signal.getsignal(signal.SIGINT)
        if not callable(previous):  # no server handles SIGTERM here (an app run in-process)
            return False

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            if self.draining:  # a second SIGTERM (or one to a retiring worker): no more waiting
                log.info("%s: closing the listener and cutting streams now",
                         "SIGTERM while retiring" if self.retiring else "second SIGTERM")
                loop.call_soon_threadsafe(self._end_now)
                return
            self.draining = True
            log.info("SIGTERM: not ready from now; closing the listener in %.1f s, cutting streams %.1f s later",
                     readiness_seconds, drain_seconds)
            loop.call_soon_threadsafe(self._begin, loop, readiness_seconds, drain_seconds,
                                      lambda: previous(signum, frame))

        def on_retire(signum: int, frame: FrameType | None) -> None:
            if self.draining:
                return
            self.draining = self.retiring = True
            log.info("retired by a rolling restart: closing the listener now, cutting streams in %.1f s",
                     drain_seconds)
            loop.call_soon_threadsafe(self._begin, loop, 0.0, drain_seconds,
                                      lambda: previous(signal.SIGTERM, frame))

        def on_sigint(signum: int, frame: FrameType | None) -> None:
            """Ctrl-C: uvicorn's own handling, except during a drain, where it is a second SIGTERM."""
            if self.draining:
                on_sigterm(signal.SIGTERM, frame)
            else:
                previous_int(signum, frame)  # type: ignore[misc,operator]  # callable when installed

        signal.signal(signal.SIGTERM, on_sigterm)
        signal.signal(RETIRE_SIGNAL, on_retire)
        if callable(previous_int):
            signal.signal(signal.SIGINT, on_sigint)
        return True


def is_cut(value: object) -> bool:
    return value is _CUT


DRAIN = Drain()
