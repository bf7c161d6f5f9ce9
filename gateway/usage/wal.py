"""The usage writer's write-ahead segment: written by the event loop, fsynced by a thread.

``add`` writes a record into the segment file at once, a copy into its memory mapping
(``MappedJournal``; one ``write`` call where the file system cannot map it): the record is in the
operating system's page cache, so a gateway process that is killed or crashes the next instant
loses none. Durability against a power loss or a kernel crash is the fsync's: a thread of its own
fsyncs what was written (one fsync for all of it, group commit) within ``sync_interval`` of the
first unsynced write, or at once when ``sync`` waits for it. The fsync never blocks the loop,
whatever the disk; a copy into the page cache takes well under a microsecond.

The thread needs the GIL to wake the ``sync`` waiters after its fsync: a busy loop thread gives it
up only after the interpreter's switch interval, 5 ms by default, a wait every reply behind it
would share; the process runs with ``SWITCH_INTERVAL`` instead. ``rotate`` starts a new segment
holding the given records (the requests still in flight); the old one keeps everything added before.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from gateway.contracts import UsageRecord
from gateway.usage.journal import Journal, MappedJournal

log = logging.getLogger("switchyard.usage")

SWITCH_INTERVAL = 0.0005  # seconds a thread waits for the GIL before the running one must yield it
SYNC_INTERVAL = 0.01  # seconds an unsynced write waits for its fsync when no reply waits for it


class WriteAhead:
    def __init__(self, directory: Path, *, sync_interval: float = SYNC_INTERVAL) -> None:
        self.directory = directory
        self.segment = new_segment(directory)
        self.sync_interval = sync_interval
        self._unsynced: list[Journal] = []  # segments written since the thread last fsynced them
        # The segment last put in that list: while the thread has not taken the list, a write to it
        # needs no lock (the thread takes the list, then fsyncs it, after the write).
        self._listed: Journal | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._cond = threading.Condition()
        self._closing = False
        self._failing = False  # the last write failed (logged once, until one succeeds)
        self._loop: asyncio.AbstractEventLoop | None = None
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self._fsync_thread = threading.Thread(target=self._run, name="usage-wal", daemon=True)
        self._fsync_thread.start()

    def add(self, record: UsageRecord) -> None:
        """Write ``record`` to the segment now. A disk that refuses it is logged, not raised: the
        record is still in the writer's memory and goes to SQL as usual."""
        segment = self.segment
        try:
            segment.append_one(record)
        except OSError:
            self._refused()
            return
        self._written(segment)

    async def sync(self) -> None:
        """Return once every record added so far is fsynced (at once after ``aclose``)."""
        if self._closing:
            return
        loop = self._loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._cond:
            self._waiters.append(done)
            self._cond.notify()
        await done

    def rotate(self, carry: list[UsageRecord]) -> Journal:
        """Start a new segment holding ``carry``, and return the old one, which holds every record
        added before (the caller discards it once those records are safe elsewhere)."""
        retired, self.segment = self.segment, new_segment(self.directory)
        self._write(self.segment, carry)
        return retired

    async def aclose(self) -> None:
        """Fsync what is left and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        await asyncio.to_thread(self._fsync_thread.join)

    def _write(self, segment: Journal, records: Iterable[UsageRecord]) -> None:
        try:
            segment.append(records, fsync=False)
        except OSError:
            self._refused()
            return
        self._written(segment)

    def _refused(self) -> None:
        if not self._failing:
            log.exception("writing the usage write-ahead segment failed; records wait in memory")
        self._failing = True

    def _written(self, segment: Journal) -> None:
        """Have the thread fsync ``segment`` (just written)."""
        if self._failing:
            log.warning("the usage write-ahead segment is written again")
            self._failing = False
        if self._listed is segment:
            return
        with self._cond:
            if segment not in self._unsynced:
                self._unsynced.append(segment)
                self._cond.notify()
            self._listed = segment

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._unsynced or self._waiters or self._closing):
                    self._cond.wait()
                if not (self._waiters or self._closing):  # let writes gather; a waiter cuts it short
                    self._cond.wait(self.sync_interval)
                segments, self._unsynced = self._unsynced, []
                self._listed = None
                waiters, self._waiters = self._waiters, []
                closing = self._closing
            for segment in segments:
                try:
                    segment.sync()
                except OSError:  # a failing disk: the records are still in memory, and go to SQL as usual
                    log.exception("fsyncing the usage write-ahead segment failed")
            loop = self._loop
            if waiters and loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(_wake, waiters)
            if closing:
                return


def new_segment(directory: Path) -> Journal:
    """A segment written through a memory mapping; on a file system that cannot allocate a file
    ahead (or map it), one written with ``write`` calls."""
    try:
        return MappedJournal(directory)
    except OSError as exc:
        log.warning("usage write-ahead segment not mapped (%s); writing it with write calls", exc)
        return Journal(directory)


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
