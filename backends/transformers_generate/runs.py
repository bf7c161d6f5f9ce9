"""The async side of a job: its events from the worker thread, the meter, cancellation, and the
loops that turn events into a whole response or a stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from backends.base import Interrupted, Meter
from backends.transformers_generate.jobs import Event, Job
from backends.transformers_generate.worker import GenerateWorker
from engine.sequence import TokenLogprob


class JobRun:
    """The async side of one job: its events in order, the meter, and cancellation."""

    def __init__(self, worker: GenerateWorker, job_args: dict[str, Any], prompt_tokens: int,
                 active: set[JobRun]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.worker = worker
        self.job = Job(**job_args, emit=self._deliver)
        self.meter = Meter(prompt_tokens=prompt_tokens, exact=True)
        self._open = self.job.num_rows
        worker.submit(self.job)  # Unavailable when the queue is full
        self._active = active
        active.add(self)
        self._interrupt: Event | None = None  # in the queue to wake a read (``interrupt``)

    def _deliver(self, ev: Event) -> None:
        """Called from the worker thread; once the event loop is gone nobody is listening."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, ev)
        except RuntimeError:  # loop closed
            self.job.aborted = True

    @property
    def done(self) -> bool:
        return self._open == 0

    async def next(self) -> Event:
        """The next event; a worker failure is raised. Call only while not ``done``."""
        ev = await self._queue.get()
        if ev.error is not None:
            if ev is self._interrupt:  # the job runs on
                raise Interrupted()
            self._open = 0
            self._active.discard(self)
            raise ev.error
        if ev.token:
            self.meter.completion_tokens += 1
            if self.meter.first_token_at is None:
                self.meter.first_token_at = time.perf_counter()
        if ev.finish is not None:
            self._open -= 1
            if self._open == 0:
                self._active.discard(self)
        return ev

    def interrupt(self) -> None:
        """Have the read of the events that waits (else the next read) give up now (from a
        callback): it raises ``Interrupted``. The job runs on until ``cancel`` aborts it."""
        if self._interrupt is None:
            self._interrupt = Event(error=Interrupted())
        self._queue.put_nowait(self._interrupt)

    async def cancel(self) -> None:
        """Abort and wait until the worker has let go of every row (at most one step)."""
        if self.done:
            return
        self.worker.cancel(self.job)
        with anyio.CancelScope(shield=True):
            while not self.done:
                try:
                    await self.next()
                except Interrupted:
                    continue  # ``interrupt``'s: the worker has not let go yet
                except Exception:
                    return  # the job failed while stopping: nothing more will come


class PendingLogprobs:
    """Token logprobs waiting for the next chunk of their choice (a token may add no text yet)."""

    def __init__(self) -> None:
        self.items: dict[int, list[TokenLogprob]] = {}

    def add(self, ev: Event) -> list[TokenLogprob] | None:
        """Record ``ev``; the logprobs to send with a chunk for it, or None when no chunk is due."""
        if ev.logprob is not None:
            self.items.setdefault(ev.index, []).append(ev.logprob)
        if not ev.text and ev.finish is None:
            return None
        return self.items.pop(ev.index, [])


async def collect(run: JobRun) -> tuple[list[str], list[Any], list[list[TokenLogprob]]]:
    texts = [""] * run.job.num_rows
    reasons: list[Any] = [None] * run.job.num_rows
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(run.job.num_rows)]
    try:
        while not run.done:
            ev = await run.next()
            texts[ev.index] += ev.text
            if ev.logprob is not None:
                logprobs[ev.index].append(ev.logprob)
            if ev.finish is not None:
                reasons[ev.index] = ev.finish
    finally:
        await run.cancel()
    return texts, reasons, logprobs


async def relay(run: JobRun, first: list[Any], on_event: Callable[[Event], list[Any]],
                 usage: Callable[[], Any] | None) -> AsyncIterator[Any]:
    try:
        for chunk in first:
            yield chunk
        while not run.done:
            for out in on_event(await run.next()):
                yield out
        if usage is not None:
            yield usage()
    finally:
        await run.cancel()
