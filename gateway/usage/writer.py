"""The batched background usage writer (a UsageSink).

``record`` appends to an in-memory buffer and writes the record to the write-ahead segment
(``gateway.usage.wal``: written at once, so a crash of the process loses nothing, and fsynced by a
thread within milliseconds); with ``sync_before_reply``, ``sync`` (awaited by the pipeline before a
response's last byte) returns once it is fsynced, one fsync serving all the records waiting. An
admitted request is noted there first (``begin``: a record of its reservation, marked incomplete),
so a request the process died in is settled from its reservation when the segment is replayed;
its real record replaces that one. Segments of a writer that is gone (their ``flock`` is free) are
replayed together at start, and retried until the database takes them (it may be down at start).
A background task inserts the buffer in batches
(``INSERT … ON CONFLICT (request_id) DO NOTHING``, so a retried batch never doubles a row; on
PostgreSQL as JSON, ``pg_bulk``, in slices with the event loop free between them, each slice a
transaction of its own, so that the writers of several workers do not deadlock on the rollups), moving
to a new segment each time (the requests still in flight move along). If the database fails, the
batch goes to the local journal and the writer keeps going: memory stays bounded (a full buffer
spills to the journal too) and the journal is replayed once inserts work again. A disk that refuses
the journal too (full, read-only) leaves the records in memory, and their write-ahead segments on
disk, until the database or the journal takes them: nothing is dropped and the loop keeps going.
Each insert also adds the rows it created to the hourly rollups (``gateway.usage.rollup``), in the
same transaction.
``aclose`` (application shutdown, which uvicorn runs on SIGTERM) flushes what is left, waiting at most
``SHUTDOWN_SECONDS`` for the database before journaling it.

Only an outage (``gateway.db.errors.is_unavailable``) sends a batch to the journal. When the
database refuses a batch for another reason, its records are inserted one at a time: the good ones
are written and a record refused for its own values (``is_bad_data``) goes to the quarantine file
beside the journal, logged with its request id, so one bad record cannot hold up every batch after
it. A failure that is neither (a schema problem, say) journals the batch and retries it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite

from gateway.contracts import INCOMPLETE, UsageRecord, completed
from gateway.db.engine import Database
from gateway.db.errors import is_bad_data, is_unavailable
from gateway.db.models import UsageRow
from gateway.usage import pg_bulk, rollup
from gateway.usage.journal import Journal, Quarantine, read_records
from gateway.usage.pricing import PriceTable
from gateway.usage.wal import SYNC_INTERVAL, WriteAhead

log = logging.getLogger("switchyard.usage")

SHUTDOWN_SECONDS = 10.0  # the most ``aclose`` waits for the database (a connect alone may take 5 s to fail)


def to_row(r: UsageRecord) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "tenant_id": r.tenant_id,
        "key_id": r.key_id,
        "model": r.model,
        "deployment": r.deployment,
        "provider": r.provider,
        "endpoint": r.endpoint,
        "stream": r.stream,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "cached_tokens": r.cached_tokens,
        "exact": r.exact,
        "cost": r.cost,
        "status": r.status,
        "error_type": r.error_type,
        "latency_ms": r.latency_ms,
        "ttft_ms": r.ttft_ms,
        "started_at": datetime.fromtimestamp(r.started_at, UTC),
        "service_tier": r.service_tier,
        "upstream_request_id": r.upstream_request_id,
    }


def _inserted(rows: list[dict[str, Any]], created: set[str]) -> list[dict[str, Any]]:
    """The rows an insert created: of the ids it returned, each one's first row (a batch holding an id
    twice had its later rows skipped by ``ON CONFLICT DO NOTHING``; the rollups must skip them too)."""
    left, out = set(created), []
    for r in rows:
        if r["request_id"] in left:
            left.discard(r["request_id"])
            out.append(r)
    return out


class _BadRecord(Exception):
    """A record that cannot even be made into a row (``to_row`` failed on one of its values)."""


def _reason(exc: BaseException) -> str:
    """The database's own words (SQLAlchemy's message adds the statement and every parameter)."""
    orig = getattr(exc, "orig", None)
    cause = orig if isinstance(orig, BaseException) else exc
    return f"{type(cause).__name__}: {cause}"[:500]


class UsageWriter:
    def __init__(
        self,
        db: Database,
        prices: PriceTable,
        *,
        journal_dir: Path,
        batch_size: int = 500,
        flush_interval: float = 0.5,
        max_buffer: int = 10_000,
        retry_interval: float = 1.0,
        sync_before_reply: bool = False,
        fsync_interval: float = SYNC_INTERVAL,
    ) -> None:
        self.db = db
        self.prices = prices
        self.journal = Journal(journal_dir)
        self.wal = WriteAhead(journal_dir, sync_interval=fsync_interval)
        self.sync_before_reply = sync_before_reply
        self._open: dict[str, UsageRecord] = {}  # begun and not yet recorded, by request id
        self._synced: asyncio.Future[None] | None = None  # what ``sync`` returns while nothing waits for fsyncs
        self.quarantine = Quarantine(journal_dir)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_buffer = max_buffer
        self.retry_interval = retry_interval
        self.written = 0  # rows this writer handed to the database successfully
        self.quarantined = 0  # records this writer set aside as refused by the database
        self.db_healthy = True
        self._buffer: list[UsageRecord] = []
        self._kept: list[Journal] = []  # retired segments whose records the journal refused, back in the buffer
        self._journal_failing = False  # the last append to the journal failed (a full disk): the flush loop retries
        self._replayed = 0  # bytes of the journal already in the database (its records read and written)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._lock = asyncio.Lock()
        self._statement = (  # SQLite's; PostgreSQL's is pg_bulk.INSERT_USAGE_AND_ROLLUPS
            sqlite.insert(UsageRow).on_conflict_do_nothing(index_elements=["request_id"]).returning(UsageRow.request_id)
        )

    # ------------------------------------------------------------ UsageSink

    def record(self, record: UsageRecord) -> None:
        try:
            self._priced(record)
            self._buffer.append(record)
            self._open.pop(record.request_id, None)
            self.wal.add(record)
            full = len(self._buffer) >= self.max_buffer
            if full and (not self._journal_failing or len(self._buffer) % self.max_buffer == 0):
                self._spill()  # a disk that refused the journal is tried again each max_buffer records
            elif len(self._buffer) >= self.batch_size:
                self._wake.set()
        except Exception:  # never raise into the request path
            log.exception("usage record dropped: %s", record.request_id)

    def begin(self, record: UsageRecord) -> None:
        try:
            if record.cost is None:  # priced as admission reserved it: every token at the highest price
                tokens = record.prompt_tokens + record.completion_tokens
                record.cost = math.ceil(tokens * self.prices.max_per_million(record.model)) / 1e6
            self._open[record.request_id] = record
            self.wal.add(record)
        except Exception:  # never raise into the request path
            log.exception("reservation of %s not journaled", record.request_id)

    def _priced(self, record: UsageRecord) -> UsageRecord:
        """``record`` with a cost: one not priced yet (None) at its model's price; a priced 0.0 (a
        free deployment or fallback answered) stays 0.0."""
        if record.cost is None:
            record.cost = self.prices.cost(record.model, record.prompt_tokens, record.completion_tokens,
                                           record.cached_tokens)
        return record

    def sync(self) -> Awaitable[None]:
        if self.sync_before_reply:
            return self.wal.sync()
        if self._synced is None:  # made in the running loop; awaiting a done future does not suspend
            self._synced = completed()
        return self._synced

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="usage-writer")

    async def aclose(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Stop the loop after its current step, then flush: to the database if it takes the
        records within ``timeout`` seconds in all, else to the journal, which the next writer on
        this folder replays. A step still under way at the deadline is cancelled: a batch cancelled
        mid-insert is journaled whole (re-inserting it is harmless), so none is lost on the way out."""
        try:
            async with asyncio.timeout(timeout):
                if self._task is not None:
                    self._stopping = True
                    self._wake.set()
                    await asyncio.gather(self._task, return_exceptions=True)
                for attempt in range(3):  # a connection the outage broke may fail once more
                    if await self.flush():
                        break
                    await asyncio.sleep(0.2 * (attempt + 1))
        except TimeoutError:
            log.warning("the usage database did not take the last records within %.0f s; they wait in %s",
                        timeout, self.journal.directory)
        self._task = None
        # requests that never settled: their reservations stand, marked incomplete
        self._buffer += self._open.values()
        await self.wal.aclose()
        if self._spill():
            self._retire(self.wal.segment)
        else:  # the segments hold the records: their files stay, for the next writer to replay
            for segment in (*self._kept, self.wal.segment):
                segment.close(remove_if_empty=False)
        self.journal.close()

    @property
    def pending(self) -> int:
        """Records not yet in the database (buffered or journaled)."""
        return len(self._buffer) + self.journal.count

    async def flush(self) -> bool:
        """Write the journal and the buffer now; True when nothing is left pending."""
        async with self._lock:
            if not await self._replay_journal():
                return False
            if not self._buffer:
                return True
            taken, retired = self._rotate()
            for i in range(0, len(taken), self.batch_size):
                try:
                    written = await self._write(taken[i : i + self.batch_size])
                except BaseException:  # cancelled mid-insert: journal the rest (re-inserting is harmless)
                    self._put_aside(taken[i:], retired)
                    raise
                if not written:
                    self._put_aside(taken[i:], retired)
                    return False
            self._retire(retired)
            return True

    # ------------------------------------------------------------ internals

    async def _run(self) -> None:
        paths, orphaned = self._read_orphans()  # read once: an unreadable line is set aside once
        replayed = await self._replay_orphans(paths, orphaned)
        interval = self.flush_interval
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                pass
            self._wake.clear()
            if self._stopping:
                return
            if not replayed:  # the database was down at start: the records of writers that died wait for it
                replayed = await self._replay_orphans(paths, orphaned)
            interval = self.flush_interval if replayed and await self.flush() else self.retry_interval

    def _rotate(self) -> tuple[list[UsageRecord], Journal]:
        """Take the buffer and start a new write-ahead segment holding the requests in flight; the
        old segment is retired once the records taken are in the database or the journal."""
        taken, self._buffer = self._buffer, []
        return taken, self.wal.rotate(list(self._open.values()))

    def _spill(self) -> bool:
        """Move the buffer to the journal; False when the disk refused it (the records stay)."""
        try:
            self.journal.append(self._buffer)
        except OSError:
            self._journal_refused()
            return False
        self._journal_failing = False
        self._buffer.clear()
        return True

    def _put_aside(self, records: list[UsageRecord], retired: Journal) -> None:
        """Journal ``records``, taken from the buffer with the segment ``retired`` and not written.
        A disk that refuses the journal (full, read-only) leaves them in memory, ahead of the
        buffer, and keeps their segment until a later flush has them safe: they are never lost,
        and the loop goes on, to write them once the database is back."""
        try:
            self.journal.append(records)
        except OSError:
            self._journal_refused()
            self._buffer[:0] = records
            self._kept.append(retired)
            return
        self._journal_failing = False
        self._retire(retired)

    def _retire(self, retired: Journal) -> None:
        """Discard ``retired`` and the segments kept for records now in the database or the journal."""
        for segment in (*self._kept, retired):
            segment.discard()
        self._kept.clear()

    def _journal_refused(self) -> None:
        if not self._journal_failing:  # logged once, not once a record
            log.exception("the usage journal refused records; they wait in memory for the database")
        self._journal_failing = True

    async def _write(self, batch: list[UsageRecord]) -> bool:
        """Settle a batch: True when every record is in the database or quarantined; False when it
        must wait (the caller journals it, or leaves it in the journal)."""
        try:
            await self._insert(batch)
        except Exception as exc:
            if not isinstance(exc, _BadRecord) and is_unavailable(exc):
                return self._failed(exc)
            log.warning("usage batch of %d refused (%s); inserting its records one at a time",
                        len(batch), _reason(exc))
            return await self._write_each(batch)
        self._succeeded(len(batch))
        return True

    async def _write_each(self, batch: list[UsageRecord]) -> bool:
        """One transaction per record; the records the database refuses for their values are
        quarantined. Stops at a failure that is not the record's (the batch is retried whole:
        records already written are skipped by request id, quarantined ones are not added twice)."""
        written = 0
        for record in batch:
            try:
                await self._insert([record])
            except Exception as exc:
                if not (isinstance(exc, _BadRecord) or is_bad_data(exc)):
                    return self._failed(exc)
                if self.quarantine.add(record, _reason(exc)):
                    self.quarantined += 1
                    log.error("usage record %s refused by the database (%s); quarantined in %s",
                              record.request_id, _reason(exc), self.quarantine.path)
                continue
            written += 1
        self._succeeded(written)
        return True

    async def _insert(self, records: list[UsageRecord]) -> None:
        """On SQLite one transaction. On PostgreSQL slices of ``rollup.SLICE_ROWS`` rows, the event
        loop serving requests between them, each slice a transaction of its own: its one statement
        locks the rollup rows it adds to in one order (table by table, key by key), so the writers
        of other workers and replicas adding to the same rows wait for each other. In one
        transaction, a later slice could need rows another writer held while that writer waited
        for rows an earlier slice held: a deadlock (four writers, 500-record batches: 11 in 10
        rounds). A batch that fails after some of its slices is journaled whole; its replay skips
        the rows already in (by request id), whose rollups went in with them."""
        rows: list[dict[str, Any]] = []
        for i in range(0, len(records), rollup.SLICE_ROWS):
            if i:
                await asyncio.sleep(0)
            try:
                rows += [to_row(self._priced(r)) for r in records[i : i + rollup.SLICE_ROWS]]
            except Exception as exc:
                raise _BadRecord(f"{type(exc).__name__}: {exc}") from None
        if self.db.dialect == "postgresql":  # the rollups in the same statement, by PostgreSQL
            for i in range(0, len(rows), rollup.SLICE_ROWS):
                async with self.db.engine.begin() as conn:
                    await pg_bulk.insert_usage_and_rollups(conn, rows[i : i + rollup.SLICE_ROWS])
            return
        async with self.db.engine.begin() as conn:
            created = set((await conn.execute(self._statement, rows)).scalars())  # not those already there
            await rollup.apply(conn, _inserted(rows, created))

    def _failed(self, exc: BaseException) -> bool:
        if self.db_healthy:
            log.error("usage insert failed (%s); journaling until the database takes it", _reason(exc))
        self.db_healthy = False
        return False

    def _succeeded(self, written: int) -> None:
        if not self.db_healthy:
            log.warning("usage database is back; replaying the journal")
        self.db_healthy = True
        self.written += written

    def _set_aside(self, line: bytes, reason: str) -> None:
        """A journal line that is not a usage record: kept in the quarantine file, never dropped."""
        self.quarantine.add_unreadable(line, reason)
        log.warning("a usage journal line is not a usage record (%s); kept in %s", reason, self.quarantine.path)

    async def _replay_journal(self) -> bool:
        """Write the journal's records to the database, then empty it. Records spilled while the
        earlier ones were being written are read next, from where the last read ended: each
        record is read and sent once, however long the database is slow and spills go on."""
        journal = self.journal
        while journal.count:
            end = journal.size
            records = journal.read(self._set_aside, start=self._replayed)
            for i in range(0, len(records), self.batch_size):
                if not await self._write(records[i : i + self.batch_size]):
                    return False
            self._replayed = end
            if journal.size == end:  # nothing spilled meanwhile (no await since the check)
                journal.truncate()
                self._replayed = 0
        return True

    def _read_orphans(self) -> tuple[list[Path], list[UsageRecord]]:
        """The journals and write-ahead segments left by writers that died (or stopped before their
        database came back), and their records merged: a request's settled record wins over the
        record of its reservation, which stands (incomplete) for a request the writer died in."""
        paths = self.journal.orphans()
        merged: dict[str, UsageRecord] = {}
        for path in paths:
            for r in read_records(path, self._set_aside):
                if r.request_id not in merged or r.extra.get("outcome") != INCOMPLETE:
                    merged[r.request_id] = r
        return paths, list(merged.values())

    async def _replay_orphans(self, paths: list[Path], records: list[UsageRecord]) -> bool:
        """Write the records of ``_read_orphans`` and delete their files; False when the database did
        not take them all (the files stay; a retry writes them all again, skipped by request id)."""
        for i in range(0, len(records), self.batch_size):
            if not await self._write(records[i : i + self.batch_size]):
                return False
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            incomplete = sum(r.extra.get("outcome") == INCOMPLETE for r in records)
            log.info("replayed %d usage records (%d of requests in flight when their writer died) from %d files",
                     len(records), incomplete, len(paths))
        return True
