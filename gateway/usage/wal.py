"""The usage writer's write-ahead segment, written and fsynced by a thread of its own.

The event loop only queues records (``add``); the thread writes what has queued up and fsyncs it
once (group commit), then wakes every ``sync`` that was waiting for those records. A write or an
fsync never blocks the loop, whatever the disk. The thread needs the GIL twice per group (to write,
and to wake the waiters): a busy loop thread gives it up only after the interpreter's switch
interval, 5 ms by default, a wait every reply behind it would share; the process runs with
``SWITCH_INTERVAL`` instead. ``rotate`` starts a new segment at a point in the
queue (records queued before it stay in the old one) and writes the given records (the requests
still in flight) into the new one first.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gateway.contracts import UsageRecord
from gateway.usage.journal import Journal

log = logging.getLogger("switchyard.usage")

T = TypeVar("T")

SWITCH_INTERVAL = 0.0005  # seconds a thread waits for the GIL before the running one must yield it


@dataclass
class _Rotate:
    carry: list[UsageRecord]
    done: asyncio.Future[Journal]


@dataclass
class _Queue:
    items: list[UsageRecord | _Rotate] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class WriteAhead:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.segment = Journal(directory)
        self._queue = _Queue()
        self._cond = threading.Condition()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self._thread = threading.Thread(target=self._run, name="usage-wal", daemon=True)
        self._thread.start()

    def add(self, record: UsageRecord) -> None:
        with self._cond:
            self._queue.items.append(record)
            self._cond.notify()

    async def sync(self) -> None:
        """Return once every record added so far is on disk (at once after ``aclose``)."""
        if self._closing:
            return
        loop = self._loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._cond:
            self._queue.waiters.append(done)
            self._cond.notify()
        await done

    async def rotate(self, carry: list[UsageRecord]) -> Journal:
        """Start a new segment holding ``carry``; the old segment (closed by the caller) is returned
        once everything queued before this call is on disk in it."""
        loop = self._loop = asyncio.get_running_loop()
        done: asyncio.Future[Journal] = loop.create_future()
        with self._cond:
            self._queue.items.append(_Rotate(carry, done))
            self._cond.notify()
        return await done

    async def aclose(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._queue.items or self._queue.waiters or self._closing):
                    self._cond.wait()
                queue, self._queue = self._queue, _Queue()
                closing = self._closing
            self._write(queue)
            if closing and not queue.items:
                return

    def _write(self, queue: _Queue) -> None:
        batch: list[UsageRecord] = []
        try:
            for item in queue.items:
                if isinstance(item, _Rotate):
                    self.segment.append(batch)
                    batch = []
                    retired, self.segment = self.segment, Journal(self.directory)
                    self.segment.append(item.carry)
                    self._resolve(item.done, retired)
                else:
                    batch.append(item)
            self.segment.append(batch)
        except Exception as exc:  # a full or failing disk: the records stay in memory and go to SQL as usual
            log.exception("writing the usage write-ahead segment failed")
            for item in queue.items:
                if isinstance(item, _Rotate) and self._loop is not None and not self._loop.is_closed():
                    self._loop.call_soon_threadsafe(_fail, item.done, exc)
        for waiter in queue.waiters:
            self._resolve(waiter, None)

    def _resolve(self, future: asyncio.Future[T], value: T) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_set, future, value)


def _set(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Journal], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
